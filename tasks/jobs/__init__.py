"""Keel's generic job layer: records, options, retries, delays, events.

It knows nothing of reports or campaigns; domain modules register handlers
with ``handler(name, queue=...)`` and add jobs with ``add(...)``.
"""

from __future__ import annotations

from tasks.jobs.errors import (
    InvalidJobState,
    JobConflict,
    JobNotFound,
    KeelError,
    UnrecoverableError,
)
from tasks.jobs.options import Backoff, Deduplication, JobOptions, KeepJobs
from tasks.jobs.producer import AddedJob, Owner, add
from tasks.jobs.task import JobContext, KeelTask, handler

__all__ = [
    "AddedJob",
    "Backoff",
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
    "add",
    "handler",
]
