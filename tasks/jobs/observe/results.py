"""A job record as Celery's result metadata: what ``AsyncResult`` reads for a Keel job.

Keel's result backend (``tasks.jobs.calls.result_backend``) answers ``AsyncResult(id)``
from the job's record, not from a copy in Redis. States map as follows:

==============================  ============================================
Keel                            Celery
==============================  ============================================
``waiting``, ``delayed``,       ``PENDING``; ``RETRY`` once a run has failed
``waiting-children``            and the job waits to run again
``active``                      ``STARTED``
``completed``                   ``SUCCESS`` (the handler's return value)
``failed``                      ``FAILURE`` (the run's exception)
``cancelled``                   ``REVOKED``
==============================  ============================================

``retries`` is Celery's count of retries, not of runs (``celery_retries``): the retries
before the last run, where ``attemptsMade`` counts that run too once it failed.

A failed run keeps its exception's type with the record (``failures.kind``); Celery
rebuilds it when that class is loaded in the reading process, and makes a class of the
same name otherwise. A job that ended without an exception of its own — stalled too
often, cancelled, a chord body whose part failed — reads as ``JobFailed`` with its
reason.

Metadata is owner-scoped: inside ``acting_as(owner)`` (or a tenant's running job) only
that tenant's jobs are read, and any other id reads as ``PENDING`` with no result, as an
unknown id does in Celery. Without an owner (a system process) every job is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from celery import states
from sqlalchemy import text

from tasks.jobs.model import owner as owner_context
from tasks.jobs.model.errors import JobFailed
from tasks.jobs.model.models import State
from tasks.jobs.store import jobs as jobs_store
from tasks.platform.db import transaction, tried_again_if_rolled_back

_CELERY_STATE = {
    State.WAITING: states.PENDING,
    State.DELAYED: states.PENDING,
    State.WAITING_CHILDREN: states.PENDING,
    State.ACTIVE: states.STARTED,
    State.COMPLETED: states.SUCCESS,
    State.FAILED: states.FAILURE,
    State.CANCELLED: states.REVOKED,
}
# The columns a result needs, never the data or options (they may be large).
_COLUMNS = (
    "id, tenant_id, state, result, failed_reason, attempts_made, finished_on, "
    "runs -> -1 -> 'exception' AS exception, runs -> -1 ->> 'outcome' AS last_outcome, "
    "stacktrace -> -1 AS traceback"
)
# How a run that failed ends (``tasks.jobs.store.runs``): each counted in ``attemptsMade``.
_FAILED_RUN = frozenset({"retrying", "failed"})


def celery_state(state: str, attempts_made: int) -> str:
    """Celery's name for a Keel state (``RETRY``: waiting to run again after a failure)."""
    mapped = str(_CELERY_STATE.get(State(state), states.PENDING))
    if mapped == states.PENDING and attempts_made > 0 and state != State.WAITING_CHILDREN:
        return str(states.RETRY)
    return mapped


def celery_retries(attempts_made: int, last_outcome: str | None) -> int:
    """Celery's ``retries``: the retries before the job's last run (the one running, or the
    last to end), as that run's ``request.retries`` read it and as Celery stores it with
    the run's state. A task failing every run with ``max_retries=3`` reads 0 while it waits
    out its first retry, and 3 once it failed.

    ``attemptsMade`` counts failed runs, the last one included once it failed; a run
    that ended otherwise (completed, deferred, stalled, cancelled) counted none.
    """
    if last_outcome in _FAILED_RUN:
        return max(0, attempts_made - 1)
    return attempts_made


def _error(row: Any) -> dict[str, Any]:
    """The failure as Celery's serialized exception (``exc_type``/``exc_module``/``…message``)."""
    reason = row.failed_reason or "the job failed"
    kind = row.exception if isinstance(row.exception, dict) else None
    if kind and kind.get("exc_type"):
        return {
            "exc_type": str(kind["exc_type"]),
            "exc_module": kind.get("exc_module"),
            "exc_message": [reason],
        }
    return {
        "exc_type": JobFailed.__qualname__,
        "exc_module": JobFailed.__module__,
        "exc_message": [reason],
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def meta_of(row: Any) -> dict[str, Any]:
    """Celery's metadata for one record, as a backend stores it (exceptions serialized)."""
    status = celery_state(row.state, row.attempts_made)
    result: Any = None
    traceback = None
    if status == states.SUCCESS:
        result = row.result
    elif status in (states.FAILURE, states.RETRY):
        result = _error(row)
        traceback = row.traceback if isinstance(row.traceback, str) else None
    elif status == states.REVOKED:
        result = {
            "exc_type": "TaskRevokedError",
            "exc_module": "celery.exceptions",
            "exc_message": [row.failed_reason or "revoked"],
        }
    return {
        "task_id": row.id,
        "status": status,
        "result": result,
        "traceback": traceback,
        "children": [],
        "date_done": _iso(row.finished_on) if status in states.READY_STATES else None,
        "retries": celery_retries(row.attempts_made, row.last_outcome),
    }


def pending(job_id: str) -> dict[str, Any]:
    """What an id reads as when it is not (or not yours to read): Celery's unknown id."""
    return {"task_id": job_id, "status": states.PENDING, "result": None, "traceback": None}


def read(job_ids: Iterable[str], *, watch: bool = False) -> dict[str, dict[str, Any]]:
    """Celery's metadata of those jobs that have a record, in one statement.

    An id the caller may not read (another tenant's) is there as ``pending``, so that
    nothing else answers for it; an id with no record is absent (not a Keel job, or its
    record was trimmed): the caller asks Celery's own store.

    ``watch``: the caller is about to wait on these jobs' ends (``AsyncResult.get()``,
    subscribed to their result channels already): the same statement marks the records it
    may read as watched, so that a worker completing one tells the channel
    (``tasks.jobs.end.finish``). A job not marked ends without that news.
    """
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return {}
    owner = owner_context.current_owner()
    if watch:
        tenant = owner.tenant_id if owner is not None else None
        # A write: a deadlock's victim (against a transaction ending several of them) reads
        # again rather than failing the caller's wait.
        rows = tried_again_if_rolled_back(lambda: _read_watching(ids, tenant))
    else:
        with transaction() as session:
            rows = list(
                session.execute(
                    text(f"SELECT {_COLUMNS} FROM jobs WHERE id = ANY(:ids)"), {"ids": ids}
                ).all()
            )
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        visible = owner is None or row.tenant_id == owner.tenant_id
        found[row.id] = meta_of(row) if visible else pending(row.id)
    return found


def _read_watching(ids: list[str], tenant_id: str | None) -> list[Any]:
    with transaction() as session:
        return jobs_store.read_watching(session, ids, tenant_id, _COLUMNS)


def goes_on_past_failure(job_id: str) -> bool:
    """Whether the job runs although the part or step before it failed, by its failure
    policy (``on_child_failure``: ``ignore`` or ``remove``): a chord body that says so
    (``chordOnFailure``), or a chain's step that has a record (after a failed step, the
    next one is recorded only when its policy goes on: ``tasks.jobs.end.ending``).

    Asked by ``AsyncResult.get()`` once it found that parent failed. Owner-scoped as
    reading is: another tenant's job, like a missing one, does not go on.
    """
    with transaction() as session:
        row = session.execute(
            text("SELECT tenant_id, celery_ctx FROM jobs WHERE id = :id"), {"id": job_id}
        ).first()
    owner = owner_context.current_owner()
    if row is None or (owner is not None and row.tenant_id != owner.tenant_id):
        return False
    ctx = row.celery_ctx if isinstance(row.celery_ctx, dict) else {}
    if "chordParts" in ctx:  # a Keel chord's body
        return ctx.get("chordOnFailure") in ("ignore", "remove")
    return True


def forget(job_id: str) -> bool:
    """Drop a job's stored result (``AsyncResult.forget``); the record and its audit stay.

    Owner-scoped as reading is; ``False`` when there was nothing of the caller's to drop.
    """
    owner = owner_context.current_owner()
    with transaction() as session:
        return jobs_store.forget_result(
            session, job_id, owner.tenant_id if owner is not None else None
        )
