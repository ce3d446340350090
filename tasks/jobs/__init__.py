"""Keel's generic job layer: records, options, retries, delays, events.

It knows nothing of reports or campaigns; domain modules register handlers
with ``handler(name, queue=...)`` and add jobs with ``add(...)``.

Its packages, each importing only from those listed after it (the
``[tool.importlinter]`` contracts in ``pyproject.toml``, checked by the tests):

- ``schedule/``  job schedulers and Celery beat's ``KeelScheduler``
- ``upkeep/``    the maintenance loop: promotion, stalled runs, reconciling,
  broker resets, the default retention (``retention``); liveness and the container
  health check
- ``run/``       a delivery's run (``execute``: ``KeelTask``, ``handler``), step by step:
  ``admission`` (limits: its queue's, ``limits``; its key's, ``key_limits``), ``claim``,
  ``running`` (the handler, ``JobContext`` from ``context``; lock renewal), ``outcome``;
  a delivery let go (``delivery``), the job's log (``job_log``),
  a run ended in the pool's hands (``request``: past its time limit, ``timeouts``;
  stopped to abort its job, ``termination``)
- ``calls/``     Celery's API over the records: ``apply_async``, retries,
  ``recorded_together`` (``celery_task``); ``AsyncResult`` (``async_result``,
  ``result_backend``);
  Celery's signals
- ``end/``       how a job ends: ``finish`` (a run's outcome), ``ending`` (``ended``:
  the one way a job ends without a result), ``canvas`` (chains, links, chords),
  cancel, abort (a running job's), revoke, stalls
- ``intake/``    how a job gets in: ``enqueue`` (``add``), ``bulk``, ``submit``,
  its message (``messages``), publishing (``promote``), tenants' admission
  (``tenancy``), Celery's call options (``celery_options``), manual retry, the
  caller's transaction (``caller_transaction``: ``in_transaction``), paused queues
  (``pauses``)
- ``observe/``   events, metrics, queries of the records (``results``: for
  ``AsyncResult``; ``job_logs``) and the broker
- ``store/``     the SQL: records, runs, upkeep, counts, listing, dedup, pauses, logs
- ``model/``     records and states, options, owner (and ``acting_as``),
  job types (``registry``), errors, formats, schedule rules, limits by key as
  declared (``key_limits``)

The names below are loaded when first used (PEP 562), so that importing a
light part of the layer — ``Owner`` for the CLI's token command, say — does
not import Celery with the task base class.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from tasks.jobs.model.options import Backoff, Deduplication, JobOptions, KeepJobs
    from tasks.jobs.model.owner import Owner, acting_as
    from tasks.jobs.run.context import JobContext
    from tasks.jobs.run.execute import KeelTask, handler

_HOMES = {
    "tasks.jobs.model.errors": (
        "Defer",
        "InvalidJobState",
        "JobConflict",
        "JobFailed",
        "JobNotFound",
        "KeelError",
        "RateLimited",
        "UnrecoverableError",
    ),
    "tasks.jobs.model.options": ("Backoff", "Deduplication", "JobOptions", "KeepJobs"),
    "tasks.jobs.model.key_limits": ("KeyConcurrency", "KeyRate"),
    "tasks.jobs.intake.enqueue": ("AddedJob", "add"),
    "tasks.jobs.calls.celery_task": ("recorded_together",),
    "tasks.jobs.intake.bulk": ("BulkJob", "add_bulk"),
    "tasks.jobs.intake.caller_transaction": ("in_transaction",),
    "tasks.jobs.model.owner": ("Owner", "acting_as"),
    "tasks.jobs.run.context": ("JobContext",),
    "tasks.jobs.run.execute": ("KeelTask", "handler"),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}

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
    "KeelError",
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
    "handler",
    "in_transaction",
    "recorded_together",
]
assert sorted(__all__) == sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
