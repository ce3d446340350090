"""Which job modules every Keel process loads, and loading them.

The job layer's own signal handlers, then the built-in apps that
``KEEL_BUILTIN_JOBS`` leaves on (the seed's ``reports`` and
``notifications``, both by default; empty or ``none`` → neither), then
yours: ``KEEL_JOB_MODULES=myapp.jobs,myapp.more`` (or ``keel up --include
myapp.jobs``). Celery imports them in a worker (``include``); the API, beat
and the CLI load them too, because judging a scheduler's template or a
submitted job needs every job type's declaration (``tasks.jobs.model.registry``),
not only those the process happened to import.

A built-in app that is off brings nothing: no job types, no queues, no
standing schedulers (beat removes the ones an earlier run stored), no
endpoints or dashboard pages (``web`` asks ``enabled``), no metrics.
"""

from __future__ import annotations

import os
import sys

from tasks.platform.builtins import (
    BUILTIN_APPS,
    DEFAULT_QUEUE,
    WEBHOOKS_QUEUE,
    BuiltinApp,
    parse_builtin,
)
from tasks.platform.config import get_settings

SIGNALS_MODULE = "tasks.jobs.calls.signals"
# The job layer's own job types, on whatever apps are on: webhook deliveries.
JOB_LAYER_MODULES = [SIGNALS_MODULE, "tasks.jobs.upkeep.webhook_delivery"]
# Kept for callers that list Keel's own modules: every built-in app's, on or off.
BUILTIN_JOB_MODULES = JOB_LAYER_MODULES + [m for a in BUILTIN_APPS.values() for m in a.modules]


def builtin_apps() -> tuple[str, ...]:
    """The built-in apps this process runs (``KEEL_BUILTIN_JOBS``)."""
    return parse_builtin(get_settings().builtin_jobs)


def enabled(app_name: str) -> bool:
    return app_name in builtin_apps()


def disabled_apps() -> list[BuiltinApp]:
    on = builtin_apps()
    return [app for name, app in BUILTIN_APPS.items() if name not in on]


def user_job_modules(setting: str | None = None) -> list[str]:
    """The import paths named by ``KEEL_JOB_MODULES`` (comma- or space-separated)."""
    text = get_settings().job_modules if setting is None else setting
    return [name for name in text.replace(",", " ").split() if name]


def job_path() -> list[str]:
    """The folders your job modules import from (``KEEL_JOB_PATH``; ``keel up`` sets it to
    the folder it was started in, since the processes it starts run in Keel's own)."""
    return [folder for folder in get_settings().job_path.split(os.pathsep) if folder]


def extend_import_path() -> None:
    """Append ``job_path`` to ``sys.path``: after Keel's own packages, so that a module of
    yours never hides one of Keel's (``keel.shadowing`` says so when one would)."""
    for folder in job_path():
        if folder not in sys.path:
            sys.path.append(folder)


def job_modules() -> list[str]:
    """Every module with job types: the job layer's, the built-in apps that are on, the user's.

    Celery imports them (``include``) once this has put ``job_path`` on the import path.
    """
    extend_import_path()
    own = JOB_LAYER_MODULES + [m for n in builtin_apps() for m in BUILTIN_APPS[n].modules]
    return own + [m for m in user_job_modules() if m not in own]


def celery_queues() -> tuple[str, ...]:
    """The queues Celery declares up front: the built-in apps' that are on, ``default`` and the
    job layer's own ``webhooks``.

    A job module's own queues are declared as its tasks are loaded
    (``tasks.celery.consume_every_job_queue``); ``tasks.jobs.model.registry.queues``
    lists every queue of a loaded job type.
    """
    return (*(BUILTIN_APPS[name].queue for name in builtin_apps()), DEFAULT_QUEUE, WEBHOOKS_QUEUE)
