"""Keel's generic job layer: records, options, retries, delays, events.

It knows nothing of reports or campaigns; domain modules register handlers
with ``handler(name, queue=...)`` and add jobs with ``add(...)``.

The names below are loaded when first used (PEP 562), so that importing a
light part of the layer — ``Owner`` for the CLI's token command, say — does
not import Celery with the task base class.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.jobs.bulk import BulkJob, add_bulk
    from tasks.jobs.calls import acting_as, recorded_together
    from tasks.jobs.enqueue import AddedJob, add
    from tasks.jobs.errors import (
        InvalidJobState,
        JobConflict,
        JobNotFound,
        KeelError,
        UnrecoverableError,
    )
    from tasks.jobs.execute import JobContext, KeelTask, handler
    from tasks.jobs.options import Backoff, Deduplication, JobOptions, KeepJobs
    from tasks.jobs.owner import Owner

_HOMES = {
    "tasks.jobs.errors": (
        "InvalidJobState",
        "JobConflict",
        "JobNotFound",
        "KeelError",
        "UnrecoverableError",
    ),
    "tasks.jobs.options": ("Backoff", "Deduplication", "JobOptions", "KeepJobs"),
    "tasks.jobs.enqueue": ("AddedJob", "add"),
    "tasks.jobs.calls": ("acting_as", "recorded_together"),
    "tasks.jobs.bulk": ("BulkJob", "add_bulk"),
    "tasks.jobs.owner": ("Owner",),
    "tasks.jobs.execute": ("JobContext", "KeelTask", "handler"),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "AddedJob",
    "Backoff",
    "BulkJob",
    "Deduplication",
    "InvalidJobState",
    "JobConflict",
    "JobContext",
    "JobNotFound",
    "JobOptions",
    "KeelError",
    "KeelTask",
    "KeepJobs",
    "Owner",
    "UnrecoverableError",
    "acting_as",
    "add",
    "add_bulk",
    "handler",
    "recorded_together",
]
assert sorted(__all__) == sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
