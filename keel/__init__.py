"""Keel: Celery jobs with BullMQ's operational semantics. This package is the public API.

Import what you use from here, and only from here::

    from keel import app, KeelTask, handler, add, JobOptions, UnrecoverableError

Every name below is loaded when first used (PEP 562), so ``import keel`` (and the
``keel`` command, which lives in this package) does not build the Celery app.
``celery -A keel worker`` (``beat``, ``flower``) finds the app here as ``keel.app``.

Keel's other packages — ``tasks`` (the job layer, the Celery app, the built-in apps),
``web`` (the HTTP API and dashboard), and the modules of this package other than the
names below — are internal: they may change in any release without notice.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    from tasks.assembly import KeelAppRefused, install
    from tasks.jobs.calls.celery_task import recorded_together
    from tasks.jobs.intake.bulk import BulkJob, add_bulk
    from tasks.jobs.intake.caller_transaction import in_transaction
    from tasks.jobs.intake.enqueue import AddedJob, add
    from tasks.jobs.model.errors import (
        Defer,
        InvalidJobState,
        JobConflict,
        JobFailed,
        JobNotFound,
        KeelError,
        RateLimited,
        UnrecoverableError,
    )
    from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
    from tasks.jobs.model.models import JobRecord
    from tasks.jobs.model.options import Backoff, Deduplication, JobOptions, KeepJobs
    from tasks.jobs.model.owner import Owner, acting_as
    from tasks.jobs.observe.queries import get as get_job
    from tasks.jobs.run.context import JobContext
    from tasks.jobs.run.execute import KeelTask, handler
    from tasks.jobs.schedule.beat import KeelScheduler

    app: Celery

# Each public name: the module it lives in, and its name there.
_PUBLIC: dict[str, tuple[str, str]] = {
    # The app Keel runs on: the one keel.install(app) was called on, else KEEL_CELERY_APP's,
    # else Keel's own (``celery -A keel`` runs that one).
    "app": ("tasks.platform.celery_app", "keel_app"),
    "install": ("tasks.assembly", "install"),
    "KeelAppRefused": ("tasks.assembly", "KeelAppRefused"),
    "KeelScheduler": ("tasks.jobs.schedule.beat", "KeelScheduler"),
    "get_job": ("tasks.jobs.observe.queries", "get"),
    "JobRecord": ("tasks.jobs.model.models", "JobRecord"),
    **{
        name: (f"tasks.jobs.{home}", name)
        for home, names in {
            "run.execute": ("KeelTask", "handler"),
            "run.context": ("JobContext",),
            "intake.enqueue": ("add", "AddedJob"),
            "intake.bulk": ("add_bulk", "BulkJob"),
            "intake.caller_transaction": ("in_transaction",),
            "calls.celery_task": ("recorded_together",),
            "model.options": ("JobOptions", "Backoff", "Deduplication", "KeepJobs"),
            "model.key_limits": ("KeyConcurrency", "KeyRate"),
            "model.owner": ("Owner", "acting_as"),
            "model.errors": (
                "KeelError",
                "Defer",
                "RateLimited",
                "UnrecoverableError",
                "JobNotFound",
                "JobConflict",
                "InvalidJobState",
                "JobFailed",
            ),
        }.items()
        for name in names
    },
}

__all__ = [
    "AddedJob",
    "Backoff",
    "BulkJob",
    "Deduplication",
    "Defer",
    "InvalidJobState",
    "JobConflict",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobOptions",
    "JobRecord",
    "KeelAppRefused",
    "KeelError",
    "KeelScheduler",
    "KeelTask",
    "KeepJobs",
    "KeyConcurrency",
    "KeyRate",
    "Owner",
    "RateLimited",
    "UnrecoverableError",
    "acting_as",
    "add",
    "add_bulk",
    "app",
    "get_job",
    "handler",
    "in_transaction",
    "install",
    "recorded_together",
]
assert sorted(__all__) == sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = getattr(import_module(module), attribute)
    if name == "app":
        value = value()
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
