"""Which job modules every Keel process loads, and loading them.

Keel's own modules, then yours: ``KEEL_JOB_MODULES=myapp.jobs,myapp.more``
(or ``keel up --include myapp.jobs``). Celery imports them in a worker
(``include``); the API, beat and the CLI load them too, because judging a
scheduler's template or a submitted job needs every job type's declaration
(``tasks.jobs.registry``), not only those the process happened to import.
"""

from __future__ import annotations

from tasks.config import get_settings

BUILTIN_JOB_MODULES = [
    "tasks.jobs.signals",
    "tasks.reports.jobs",
    "tasks.reports.schedules",
    "tasks.notifications.jobs",
    "tasks.notifications.schedules",
]


def user_job_modules(setting: str | None = None) -> list[str]:
    """The import paths named by ``KEEL_JOB_MODULES`` (comma- or space-separated)."""
    text = get_settings().job_modules if setting is None else setting
    return [name for name in text.replace(",", " ").split() if name]


def job_modules() -> list[str]:
    """Every module with job types: Keel's own, then the user's."""
    return BUILTIN_JOB_MODULES + [m for m in user_job_modules() if m not in BUILTIN_JOB_MODULES]
