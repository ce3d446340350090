"""The job modules Keel ships, and loading them so every job type is declared.

Celery imports these in a worker (``include``); the API and the CLI load them
too, because judging a scheduler's template needs every job type's declaration
(``tasks.jobs.registry``), not only those the process happened to import.
"""

from __future__ import annotations

from importlib import import_module

from tasks.jobs import registry

JOB_MODULES = [
    "tasks.jobs.signals",
    "tasks.reports.jobs",
    "tasks.reports.schedules",
    "tasks.notifications.jobs",
    "tasks.notifications.schedules",
]


def load() -> list[str]:
    """Import every job module (idempotent); the names of the declared job types."""
    for module in JOB_MODULES:
        import_module(module)
    return registry.names()
