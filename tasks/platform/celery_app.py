"""The Celery app Keel runs on, for every layer that publishes, inspects or configures it.

The job layer sends messages, reads ``app.conf`` and ``app.tasks`` and asks workers
through ``app.control``; it does so through ``app`` here, a proxy (as Celery's own
``current_app``) to the app Keel was set up on. That app is built and set here by
its assembly (``tasks.celery``, Keel's own app), which this module imports by name
the first time the app is needed and none is set yet; nothing here imports it, so
the layers below the assembly never import the layers above them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from celery.local import Proxy

if TYPE_CHECKING:
    from celery import Celery

DEFAULT_ASSEMBLY = "tasks.celery"

_app: Celery | None = None


def set_app(app: Celery) -> None:
    """Make ``app`` the one Keel runs on (its assembly calls this once it is configured)."""
    global _app
    _app = app


def keel_app() -> Celery:
    """The app Keel runs on; Keel's own, built on first use, if none was set."""
    if _app is None:
        import_module(DEFAULT_ASSEMBLY)
        if _app is None:
            raise RuntimeError(f"{DEFAULT_ASSEMBLY} built no app for Keel")
    return _app


app: Celery = Proxy(keel_app)
