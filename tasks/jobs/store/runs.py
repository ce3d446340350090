"""A job's runs: its claim, progress and lock renewal, and how each run ends.

Every transition a worker makes is one atomic statement guarded by the lock
token it got when it claimed the job, so a worker that lost its job
(stalled, then picked up elsewhere) cannot overwrite what the new owner
records. Callers own the transaction and pass the session in; the
``*_alone`` forms of a worker's claim and completion are their own
statement, sent without a Session (``tasks.platform.db.run_alone``).

A run whose job an owner asked to abort (``abort_requested_at``, ``tasks.jobs.end.abort``)
records no completion, failure or deferral: those statements refuse it, and its end is
``end_aborted`` instead, which cancels the job.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.model import formats
from tasks.jobs.model.models import JobRecord, State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.store.jobs import CancelledJob, Job, cancelled_job, get
from tasks.platform.db import affected, engine, run_alone


@dataclass(frozen=True)
class ClaimedJob(Job):
    """What a worker knows about a job it is about to run (its options parsed once)."""

    user_id: str | None
    opts: JobOptions
    attempts_made: int
    attempts_started: int
    stalled: bool
    token: str
    wait_s: float = 0.0
    celery_ctx: dict[str, Any] | None = None
    parent_job_id: str | None = None  # the job that added it as a child, woken by its end


@dataclass(frozen=True)
class FailedRun:
    """What recording a failed run did: ``retry_at`` set if the job runs again, else final."""

    ours: bool
    retry_at: datetime | None = None

    @property
    def final(self) -> bool:
        return self.ours and self.retry_at is None


NOW_ISO = """to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
_FINISH_RUN = f"""
    runs = jsonb_set(runs, ARRAY[(jsonb_array_length(runs) - 1)::text],
                     (runs -> -1) || CAST(:run_patch AS jsonb)
                     || jsonb_build_object('finishedAt', {NOW_ISO}))
"""

# --- running --------------------------------------------------------------------------------

# One statement: lock the row, remember its state, and move it to active if it is
# waiting (or active with a lock that ran out: a stalled run, counted as such).
# The conditions read the locked row (``before``), not the statement's snapshot: a
# promoter publishes inside its transaction, so a delivery can arrive while the row
# is still delayed in that snapshot; the lock waits for the promoter's commit, and
# ``before`` then holds the row as committed (the update itself follows it there).
#
# The delivery's canvas context (chord, chain, links) replaces the record's, except the
# call's ``headers=``, the add's trace context (``tasks.platform.tracing``) and its time limits
# (``timelimit``): only its add records them, and every later run and publish reads them
# there (a message from a release that did not send time limits must not drop them).
#
# A run being aborted is never taken over: the stalled check cancels it
# (``store.upkeep.requeue_stalled``). A waiting job is never being aborted: the claim clears
# what a release that did not know of aborts may have left when it requeued one.
#
# A record in a layout this release does not read (``tasks.jobs.model.formats``) is not claimed:
# it waits for a worker of the release that wrote it.
_FORMATS_READ = ", ".join(str(f) for f in sorted(formats.RECORD_FORMATS_READ))
_CLAIM = text(
    f"""
    WITH before AS (SELECT id, state, locked_until, format, abort_requested_at
                    FROM jobs WHERE id = :id FOR UPDATE)
    UPDATE jobs SET
        stalled_count = jobs.stalled_count + CASE WHEN before.state = 'active' THEN 1 ELSE 0 END,
        state = 'active',
        attempts_started = jobs.attempts_started + 1,
        processed_on = clock_timestamp(),
        lock_token = :token,
        locked_until = clock_timestamp() + make_interval(secs => :lock_s),
        abort_requested_at = NULL,
        celery_ctx = COALESCE(
            CAST(:ctx AS jsonb)
                || jsonb_strip_nulls(jsonb_build_object(
                    'headers', jobs.celery_ctx -> 'headers', 'trace', jobs.celery_ctx -> 'trace',
                    'timelimit', jobs.celery_ctx -> 'timelimit',
                    'concurrency_key', jobs.celery_ctx -> 'concurrency_key')),
            jobs.celery_ctx),
        runs = jobs.runs || jsonb_build_array(jsonb_build_object(
            'attempt', jobs.attempts_started + 1,
            'startedAt', to_char(clock_timestamp() AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'worker', CAST(:worker AS text), 'pid', CAST(:pid AS integer)))
    FROM before
    WHERE jobs.id = before.id
      AND before.format IN ({_FORMATS_READ})
      AND (before.state = 'waiting'
           OR (before.state = 'active' AND before.locked_until < clock_timestamp()
               AND before.abort_requested_at IS NULL))
    RETURNING jobs.id, jobs.name, jobs.queue, jobs.data, jobs.opts, jobs.extra_opts,
              jobs.tenant_id, jobs.user_id, jobs.attempts_made, jobs.attempts_started,
              jobs.celery_ctx, jobs.parent_job_id,
              before.state = 'active' AS stalled,
              EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(jobs.run_at, jobs.created_at))
                  AS wait_s
    """
)


def claim(
    session: Session,
    job_id: str,
    token: str,
    lock_s: float,
    worker: str,
    ctx: dict[str, Any] | None = None,
) -> ClaimedJob | None:
    """Move a waiting job (or one whose lock ran out) to active; ``None`` if not ours to run."""
    row = session.execute(_CLAIM, _claim_params(job_id, token, lock_s, worker, ctx))
    return _claimed(row.mappings().first(), token)


def claim_alone(
    job_id: str, token: str, lock_s: float, worker: str, ctx: dict[str, Any] | None = None
) -> ClaimedJob | None:
    """``claim`` as its own statement, without a Session (``tasks.platform.db.run_alone``): a
    recorded job's delivery, the hot path."""
    return _claimed(run_alone(_CLAIM, _claim_params(job_id, token, lock_s, worker, ctx)), token)


# Tried only when no committed row is visible: an insert of an id that another transaction
# is inserting waits until that transaction ends (PostgreSQL's unique check), then
# conflicts if the row was committed.
_AWAIT_INSERT = text(
    """
    INSERT INTO jobs (id, queue, name, data, opts, state)
    SELECT CAST(:id AS text), '', '', '{}'::jsonb, '{}'::jsonb, 'waiting'
    WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = CAST(:id AS text))
    ON CONFLICT (id) DO NOTHING
    RETURNING id
    """
)


def await_insert(job_id: str) -> bool:
    """Whether ``job_id`` has a record, once any transaction still inserting it has ended.

    A delivery can outrun the transaction that records its job: a chain's next step and
    a task's links are recorded and published inside the transaction that completes
    their parent (``tasks.jobs.end.canvas``). Its claim finds no row and does not wait, since
    an uncommitted insert is invisible to it, unlike a locked row. An insert of the same
    id does wait for that transaction. This one is tried only if no row is visible, and
    always rolled back: it never records anything, and a job that has no record stays
    without one. The caller tries again when this says ``True``: a delivery refused
    because its job is not waiting (a duplicate, a cancelled or finished job) is refused
    once more, one claim later.
    """
    with engine().connect() as connection:
        inserted = connection.execute(_AWAIT_INSERT, {"id": job_id}).first() is not None
        connection.rollback()
    return not inserted


def _claim_params(
    job_id: str, token: str, lock_s: float, worker: str, ctx: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": job_id,
        "token": token,
        "lock_s": lock_s,
        "worker": worker,
        "pid": os.getpid(),  # the pool process running it (``active_run``)
        "ctx": json.dumps(ctx) if ctx else None,
    }


_ACTIVE_RUN = text(
    """
    SELECT id, name, queue, data, opts, extra_opts, tenant_id, user_id, attempts_made,
           attempts_started, celery_ctx, parent_job_id, stalled_count > 0 AS stalled,
           0 AS wait_s, lock_token
    FROM jobs
    WHERE id = :id AND state = 'active' AND lock_token IS NOT NULL
      AND runs -> -1 ->> 'worker' = :worker AND runs -> -1 ->> 'pid' = :pid
    """
)


_ACTIVE_RUN_LOCKED = text(f"{_ACTIVE_RUN.text} FOR UPDATE")


def active_run(
    session: Session, job_id: str, worker: str, pid: int, *, lock: bool = False
) -> ClaimedJob | None:
    """The job's run if it is still active and the one pool process ``pid`` of ``worker``
    claimed last (its lock token included, so its end is recorded as the run's own would
    be); ``None`` once that run ended or another took the job over. ``lock``: its row is
    locked until the transaction ends, so the run cannot record its end meanwhile."""
    statement = _ACTIVE_RUN_LOCKED if lock else _ACTIVE_RUN
    row = session.execute(statement, {"id": job_id, "worker": worker, "pid": str(pid)})
    found = row.mappings().first()
    return _claimed(found, found["lock_token"]) if found is not None else None


def _claimed(row: Any, token: str) -> ClaimedJob | None:
    if row is None:
        return None
    return ClaimedJob(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        data=row["data"],
        opts=JobOptions.from_stored(row["opts"], row["extra_opts"]),
        tenant_id=row["tenant_id"],
        user_id=row["user_id"],
        attempts_made=row["attempts_made"],
        attempts_started=row["attempts_started"],
        stalled=bool(row["stalled"]),
        token=token,
        wait_s=max(0.0, float(row["wait_s"] or 0)),
        celery_ctx=row["celery_ctx"],
        parent_job_id=row["parent_job_id"],
    )


def set_progress(session: Session, job: ClaimedJob, progress: Any) -> bool:
    row = session.execute(
        text(
            "UPDATE jobs SET progress = CAST(:p AS jsonb) "
            "WHERE id = :id AND lock_token = :token RETURNING id"
        ),
        {"id": job.id, "token": job.token, "p": json.dumps(progress)},
    ).first()
    return row is not None


def extend_locks(session: Session, tokens: list[str], lock_s: float) -> int:
    """Push the lock of every job these tokens hold further out (lock renewal)."""
    if not tokens:
        return 0
    result = session.execute(
        text(
            "UPDATE jobs SET locked_until = clock_timestamp() + make_interval(secs => :lock_s) "
            "WHERE lock_token = ANY(:tokens) AND state = 'active'"
        ),
        {"tokens": tokens, "lock_s": lock_s},
    )
    return affected(result)


# --- finishing ------------------------------------------------------------------------------


_COMPLETE_SQL = f"""
    UPDATE jobs SET state = 'completed', result = CAST(:result AS jsonb),
        failed_reason = NULL,  -- an earlier run's failure stays in that run (``runs``)
        finished_on = clock_timestamp(), lock_token = NULL, locked_until = NULL,
        {_FINISH_RUN}
    WHERE id = :id AND lock_token = :token AND abort_requested_at IS NULL {{alone}}
    RETURNING id, awaited, watched
    """
_COMPLETE = text(_COMPLETE_SQL.format(alone=""))
# Alone, a job another waits for is not completed: its end wakes the waiter in the same
# transaction (``complete``). A waiter marks it before it waits, and the mark's row lock
# makes this statement re-read the row it waited for (``tasks.jobs.store.waits``).
_COMPLETE_ALONE = text(_COMPLETE_SQL.format(alone="AND awaited IS NOT TRUE"))
_COMPLETED_RUN = json.dumps({"outcome": "completed"})


def _complete_params(job: ClaimedJob, result: Any) -> dict[str, Any]:
    return {
        "id": job.id,
        "token": job.token,
        "result": json.dumps(result),
        "run_patch": _COMPLETED_RUN,
    }


class Completed(NamedTuple):
    """A recorded success: ``awaited``, another job waits for this one's end; ``watched``, a
    caller waits on its result (``tasks.jobs.observe.results.read``)."""

    awaited: bool
    watched: bool


def complete(session: Session, job: ClaimedJob, result: Any) -> Completed | None:
    """Record success; ``None`` if the job is no longer ours."""
    row = session.execute(_COMPLETE, _complete_params(job, result)).first()
    return None if row is None else Completed(bool(row.awaited), bool(row.watched))


def complete_alone(job: ClaimedJob, result: Any) -> Completed | None:
    """``complete`` as its own statement, without a Session (``tasks.platform.db.run_alone``);
    ``None``: not done, for the job is no longer ours or another job waits for it (then
    ``complete`` records it, in a transaction that wakes the waiter)."""
    row = run_alone(_COMPLETE_ALONE, _complete_params(job, result))
    return None if row is None else Completed(bool(row["awaited"]), bool(row["watched"]))


def fail(
    session: Session,
    job: ClaimedJob,
    reason: str,
    stack: list[str],
    retry_in_ms: int | None,
    data: dict[str, Any] | None = None,
    kind: dict[str, str] | None = None,
    *,
    alone: bool = False,
) -> FailedRun:
    """Record a failed run: ``retry_in_ms`` set → delayed until then, else failed for good.

    ``data`` replaces the job's data for its next run (only when it runs again); ``kind``
    is the exception's type (``failures.kind``), kept in the run as ``exception``.
    ``alone`` (the statement is its own transaction): a job another waits for is not failed
    for good here (not ours), for its end to wake the waiter in one transaction, as
    ``complete_alone`` refuses it.
    """
    retrying = retry_in_ms is not None
    row = session.execute(
        text(
            f"""
            UPDATE jobs SET
                attempts_made = attempts_made + 1,
                failed_reason = :reason,
                data = CASE WHEN :retrying THEN COALESCE(CAST(:data AS jsonb), data) ELSE data END,
                stacktrace = stacktrace || CAST(:stack AS jsonb),
                state = CASE WHEN :retrying THEN 'delayed' ELSE 'failed' END,
                run_at = CASE WHEN :retrying
                              THEN clock_timestamp() + make_interval(secs => :delay_s)
                              ELSE run_at END,
                finished_on = CASE WHEN :retrying THEN NULL ELSE clock_timestamp() END,
                lock_token = NULL, locked_until = NULL,
                {_FINISH_RUN}
            WHERE id = :id AND lock_token = :token AND abort_requested_at IS NULL
              AND (NOT :alone OR :retrying OR awaited IS NOT TRUE)
            RETURNING run_at
            """
        ),
        {
            "id": job.id,
            "token": job.token,
            "alone": alone,
            "reason": reason,
            "stack": json.dumps(stack[-10:]),
            "retrying": retrying,
            "data": json.dumps(data) if data is not None else None,
            "delay_s": (retry_in_ms or 0) / 1000.0,
            "run_patch": json.dumps(
                {
                    "outcome": "retrying" if retrying else "failed",
                    "error": reason,
                    **({"exception": kind} if kind else {}),
                }
            ),
        },
    ).first()
    if row is None:
        return FailedRun(ours=False)
    return FailedRun(ours=True, retry_at=row[0] if retrying else None)


def defer(session: Session, job: ClaimedJob, delay_ms: int, state: State, reason: str) -> bool:
    """Park a job until later without counting a failed run (BullMQ's ``moveToDelayed``)."""
    row = session.execute(
        text(
            f"""
            UPDATE jobs SET state = :state,
                run_at = clock_timestamp() + make_interval(secs => :delay_s),
                lock_token = NULL, locked_until = NULL,
                {_FINISH_RUN}
            WHERE id = :id AND lock_token = :token AND abort_requested_at IS NULL
            RETURNING id
            """
        ),
        {
            "id": job.id,
            "token": job.token,
            "state": state,
            "delay_s": delay_ms / 1000.0,
            "run_patch": json.dumps({"outcome": "deferred", "reason": reason}),
        },
    ).first()
    return row is not None


def fail_unsupported(
    session: Session, job_id: str, name: str, reason: str | None = None
) -> JobRecord | None:
    """A message no worker has a handler for (or whose handler cannot take its arguments,
    ``reason``): failed at once, as a run that failed."""
    reason = reason or f"unsupported job: {name}"
    row = session.execute(
        text(
            """
            WITH before AS (SELECT id, state FROM jobs WHERE id = :id FOR UPDATE)
            UPDATE jobs SET state = 'failed', failed_reason = :reason,
                attempts_made = jobs.attempts_made + 1,
                attempts_started = jobs.attempts_started + 1,
                processed_on = clock_timestamp(), finished_on = clock_timestamp(),
                runs = jobs.runs || jsonb_build_array(jsonb_build_object(
                    'attempt', jobs.attempts_started + 1, 'outcome', 'failed',
                    'error', CAST(:reason AS text)))
            FROM before
            WHERE jobs.id = before.id AND before.state IN ('waiting', 'active')
            RETURNING jobs.id
            """
        ),
        {"id": job_id, "reason": reason},
    ).first()
    return get(session, job_id) if row is not None else None


# --- aborting -------------------------------------------------------------------------------

_MARK_ABORT = text(
    """
    UPDATE jobs SET abort_requested_at = clock_timestamp()
    WHERE id = :id AND state = 'active' AND abort_requested_at IS NULL
    RETURNING abort_requested_at
    """
)


def mark_abort(session: Session, job_id: str) -> bool:
    """Ask for the active job's run to be aborted; ``False`` if it is not active or was
    asked already (the caller holds its row lock)."""
    return session.execute(_MARK_ABORT, {"id": job_id}).first() is not None


_IS_ABORTED = text(
    """
    SELECT NOT EXISTS (SELECT 1 FROM jobs WHERE id = :id AND lock_token = :token
                                          AND abort_requested_at IS NULL) AS aborted
    """
)


def is_aborted(job: ClaimedJob) -> bool:
    """Whether this run should stop: its job is being aborted, or the run is no longer the
    job's (cancelled, or taken over), so nothing it returns would be recorded."""
    row = run_alone(_IS_ABORTED, {"id": job.id, "token": job.token})
    return bool(row and row["aborted"])


_END_ABORTED = text(
    f"""
    UPDATE jobs SET state = 'cancelled', finished_on = clock_timestamp(),
        lock_token = NULL, locked_until = NULL,
        {_FINISH_RUN}
    WHERE id = :id AND lock_token = :token AND abort_requested_at IS NOT NULL
    RETURNING id, name, queue, data, opts, tenant_id, user_id, celery_ctx, parent_job_id
    """
)


def end_aborted(session: Session, job: ClaimedJob, reason: str) -> CancelledJob | None:
    """The run of a job being aborted ends, and the job with it: ``cancelled``, the run's
    outcome too; ``None`` if no abort was asked or the run is no longer the job's."""
    row = session.execute(
        _END_ABORTED,
        {
            "id": job.id,
            "token": job.token,
            "run_patch": json.dumps({"outcome": "cancelled", "reason": reason}),
        },
    ).first()
    return cancelled_job(row) if row is not None else None


_OVERDUE_ABORTS = text(
    """
    SELECT id, runs -> -1 ->> 'pid' AS pid FROM jobs
    WHERE abort_requested_at IS NOT NULL AND state = 'active'
      AND abort_requested_at < clock_timestamp() - make_interval(secs => :grace_s)
      AND runs -> -1 ->> 'worker' = :worker
    """
)


def overdue_aborts(session: Session, worker: str, grace_s: float) -> list[tuple[str, int | None]]:
    """The runs of ``worker`` being aborted for longer than ``grace_s``: (job id, pool pid)."""
    rows = session.execute(_OVERDUE_ABORTS, {"worker": worker, "grace_s": grace_s})
    return [(row.id, int(row.pid) if row.pid else None) for row in rows]
