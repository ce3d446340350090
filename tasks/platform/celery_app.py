"""The Celery app Keel runs on, for every layer that publishes, inspects or configures it.

The job layer sends messages, reads ``app.conf`` and ``app.tasks`` and asks workers
through ``app.control``; it does so through ``app`` here, a proxy (as Celery's own
``current_app``) to the app Keel was set up on: the one ``keel.install(app)`` was
called on (``tasks.assembly``). A process that has none yet loads the app
``KEEL_CELERY_APP`` names (``proj.celery:app``), or else Keel's own (``tasks.celery``),
by name, the first time the app is needed; nothing here imports them, so the layers
below the assembly never import the layers above them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from celery import _state
from celery.local import Proxy

from tasks.platform.catalog import extend_import_path
from tasks.platform.config import PREFIX, get_settings
from tasks.platform.errors import KeelError

if TYPE_CHECKING:
    from celery import Celery

OWN_APP = "tasks.celery"

_app: Celery | None = None


class NotInstalled(KeelError):
    """The app Keel was told to run on was not set up for it (``keel.install(app)``)."""


def set_app(app: Celery) -> None:
    """Make ``app`` the one Keel runs on (``install`` calls this)."""
    global _app
    _app = app


def installed() -> Celery | None:
    """The app Keel was set up on in this process, if any yet."""
    return _app


def keel_app() -> Celery:
    """The app Keel runs on: the installed one, else ``KEEL_CELERY_APP``'s, else Keel's own."""
    if _app is None:
        named = get_settings().celery_app
        extend_import_path()  # KEEL_JOB_PATH: where a project's modules import from
        import_module((named or OWN_APP).partition(":")[0])
        if _app is None:
            raise NotInstalled(
                f"{PREFIX}CELERY_APP={named} names a module that does not call "
                "keel.install(app) when it is imported"
            )
    return _app


app: Celery = Proxy(keel_app)

# Celery binds a ``@shared_task`` (and so a ``handler``) to the current app, and a thread
# that never made or set one gets Celery's default app, which Celery makes for itself
# (named "default", with none of Keel's settings). The default is Keel's app instead: the
# installed one once there is one, else the one ``keel_app`` loads when first used, which
# then sets itself as the default (``app.set_default()`` in ``install``).
if _state.default_app is None:
    _state.set_default_app(app)
