"""Every statement on the ``jobs`` table, each state transition one atomic statement.

Every transition a worker makes is guarded by the lock token it got when it
claimed the job, so a worker that lost its job (stalled, then picked up
elsewhere) cannot overwrite what the new owner records. Callers own the
transaction (``with transaction() as session``) and pass the session in;
the ``*_alone`` forms of a worker's claim and completion are their own
statement, sent without a Session (``tasks.db.run_alone``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, select, text
from sqlalchemy.orm import Session

from tasks.db import run_alone
from tasks.jobs.models import JobRecord, RetryAudit, State
from tasks.jobs.options import JobOptions
from tasks.jobs.store import affected


@dataclass(frozen=True)
class Job:
    """A job as it travels between the store and the lifecycle: who, what, where."""

    id: str
    name: str
    queue: str
    data: dict[str, Any]
    tenant_id: str | None


@dataclass(frozen=True)
class NewJob(Job):
    """A job about to be recorded."""

    user_id: str | None
    opts: JobOptions
    celery_ctx: dict[str, Any] | None = None
    waiting_children: bool = False  # a chord's body: waits (no due time) for its parts

    @property
    def state(self) -> State:
        if self.waiting_children:
            return State.WAITING_CHILDREN
        return State.DELAYED if self.opts.delay > 0 else State.WAITING


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


@dataclass(frozen=True)
class FailedRun:
    """What recording a failed run did: ``retry_at`` set if the job runs again, else final."""

    ours: bool
    retry_at: datetime | None = None

    @property
    def final(self) -> bool:
        return self.ours and self.retry_at is None


@dataclass(frozen=True)
class ReadyJob(Job):
    """A job that just became waiting and needs its message (promoted, requeued, listed)."""

    celery_ctx: dict[str, Any] | None = None
    state: State = State.WAITING
    opts: dict[str, Any] | None = None


def ready_job(row: Any, **more: Any) -> ReadyJob:
    return ReadyJob(
        id=row.id,
        name=row.name,
        queue=row.queue,
        data=row.data,
        tenant_id=row.tenant_id,
        celery_ctx=row.celery_ctx,
        **more,
    )


_NOW_ISO = """to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
_FINISH_RUN = f"""
    runs = jsonb_set(runs, ARRAY[(jsonb_array_length(runs) - 1)::text],
                     (runs -> -1) || CAST(:run_patch AS jsonb)
                     || jsonb_build_object('finishedAt', {_NOW_ISO}))
"""

# --- adding ---------------------------------------------------------------------------------

_INSERT_ONE = """
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, celery_ctx, run_at)
    VALUES (:id, :queue, :name, CAST(:data AS jsonb), CAST(:opts AS jsonb),
            :tenant_id, :user_id, :state, CAST(:ctx AS jsonb),
            CASE WHEN :delay_ms > 0
                 THEN clock_timestamp() + make_interval(secs => CAST(:delay_ms AS float) / 1000)
                 END)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
"""
_INSERT = text(_INSERT_ONE)
# The insert, and (in the same statement, from its snapshot: without the new job) how
# many jobs its party has running or waiting on its queue — what places it among the
# queue's priorities (``tasks.jobs.tenancy``).
_INSERT_COUNTING = """
    WITH load AS (SELECT count(*) AS on_queue FROM (
                      SELECT 1 FROM jobs
                      WHERE {party} AND queue = :queue AND state IN ('waiting', 'active')
                      LIMIT :up_to) AS ahead),
         added AS ({insert})
    SELECT (SELECT id FROM added) AS id, (SELECT on_queue FROM load) AS on_queue
"""


def row_of(job: NewJob) -> dict[str, Any]:
    """The parameters of ``job``'s insert."""
    return {
        "id": job.id,
        "queue": job.queue,
        "name": job.name,
        "data": json.dumps(job.data),
        "opts": json.dumps(job.opts.stored()),
        "tenant_id": job.tenant_id,
        "user_id": job.user_id,
        "state": job.state,
        "ctx": json.dumps(job.celery_ctx) if job.celery_ctx else None,
        "delay_ms": job.opts.delay,
    }


def insert(session: Session, job: NewJob) -> bool:
    """Record ``job``; ``False`` if a job with its id exists (nothing is changed)."""
    return session.execute(_INSERT, row_of(job)).first() is not None


# Built once (an add is the hot path): the system's jobs' party, and a tenant's.
_INSERT_COUNTING_BY_PARTY = {
    system: text(
        _INSERT_COUNTING.format(
            party="tenant_id IS NULL" if system else "tenant_id = :tenant_id", insert=_INSERT_ONE
        )
    )
    for system in (True, False)
}


def insert_counting(session: Session, job: NewJob, up_to: int) -> tuple[bool, int]:
    """``insert``, in the same statement counting the jobs its party (tenant, or the system's
    jobs) has waiting or active on its queue, up to ``up_to`` (a count that stops there
    costs the same with a million waiting): ``(created, on_queue)``."""
    statement = _INSERT_COUNTING_BY_PARTY[job.tenant_id is None]
    row = session.execute(statement, {**row_of(job), "up_to": up_to}).one()
    return row.id is not None, int(row.on_queue)


_INSERT_MANY = text(
    """
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, celery_ctx, run_at)
    SELECT r.id, r.queue, r.name, r.data, r.opts, r.tenant_id, r.user_id, r.state, r.ctx,
           CASE WHEN r.delay_ms > 0
                THEN clock_timestamp() + make_interval(secs => r.delay_ms / 1000.0) END
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        id text, queue text, name text, data jsonb, opts jsonb, tenant_id text, user_id text,
        state text, ctx jsonb, delay_ms bigint)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
    """
)


def insert_many(session: Session, jobs: Sequence[NewJob]) -> set[str]:
    """Record ``jobs`` in one statement; the ids that were new (an existing id changes nothing)."""
    rows = [
        {
            "id": job.id,
            "queue": job.queue,
            "name": job.name,
            "data": job.data,
            "opts": job.opts.stored(),
            "tenant_id": job.tenant_id,
            "user_id": job.user_id,
            "state": str(job.state),
            "ctx": job.celery_ctx,
            "delay_ms": job.opts.delay,
        }
        for job in jobs
    ]
    found = session.execute(_INSERT_MANY, {"rows": json.dumps(rows)}).scalars()
    return set(found)


def delete_delayed(session: Session, job_id: str) -> bool:
    """Debounce with replace: drop a still-delayed job that a new add replaces."""
    statement = text("DELETE FROM jobs WHERE id = :id AND state = 'delayed' RETURNING id")
    return session.execute(statement, {"id": job_id}).first() is not None


# Statements a delivery makes before (or instead of) its claim lock the row by id first
# and test its state there, like the claim: the delivery may come from a promoter whose
# transaction has not committed yet (see _CLAIM), and a test against the statement's
# snapshot would find the job still delayed and do nothing.
_PARK = text(
    """
    WITH before AS (SELECT id, state FROM jobs WHERE id = ANY(:ids) FOR UPDATE)
    UPDATE jobs SET state = 'delayed', run_at = clock_timestamp() + make_interval(secs => :s)
    FROM before WHERE jobs.id = before.id AND before.state = 'waiting'
    """
)


def park(session: Session, job_ids: Sequence[str], in_s: float) -> None:
    """Waiting jobs whose message could not be published (or that a limit holds) go back to
    the delayed set, due again in ``in_s`` seconds."""
    session.execute(_PARK, {"ids": list(job_ids), "s": in_s})


_LOAD = """
    SELECT count(*) AS live,
           count(*) FILTER (WHERE queue = :queue AND state IN ('waiting', 'active')) AS on_queue
    FROM jobs WHERE {party}
      AND state IN ('waiting', 'active', 'delayed', 'waiting-children')
"""


# The insert if the party has fewer than ``max_live`` live jobs, with the party's load, in
# one statement (its snapshot is taken after the caller's quota lock: ``tenancy.admit_insert``).
# The insert of ``row_of(job)``'s job, one row selected ``FROM {source} WHERE {condition}``
# (inside a statement that decides whether it may be added).
INSERT_IF = """
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, celery_ctx, run_at)
    SELECT :id, :queue, :name, CAST(:data AS jsonb), CAST(:opts AS jsonb),
           :tenant_id, :user_id, :state, CAST(:ctx AS jsonb),
           CASE WHEN CAST(:delay_ms AS bigint) > 0
                THEN clock_timestamp() + make_interval(secs => CAST(:delay_ms AS float) / 1000)
                END
    FROM {source} WHERE {condition}
    ON CONFLICT (id) DO NOTHING
    RETURNING id
"""
_INSERT_WITHIN = """
    WITH load AS ({load}),
         added AS ({insert})
    SELECT (SELECT id FROM added) AS id, load.live, load.on_queue FROM load
"""
_INSERT_WITHIN_BY_PARTY = {
    system: text(
        _INSERT_WITHIN.format(
            load=_LOAD.format(party="tenant_id IS NULL" if system else "tenant_id = :tenant_id"),
            insert=INSERT_IF.format(
                source="load",
                condition="CAST(:max_live AS bigint) IS NULL "
                "OR load.live < CAST(:max_live AS bigint)",
            ),
        )
    )
    for system in (True, False)
}


def insert_within(session: Session, job: NewJob, max_live: int | None) -> tuple[bool, int, int]:
    """``insert`` unless the job's party already has ``max_live`` live jobs (``None``: no
    bound), and the party's load before it, in one statement: ``(created, live, on_queue)``."""
    statement = _INSERT_WITHIN_BY_PARTY[job.tenant_id is None]
    row = session.execute(statement, {**row_of(job), "max_live": max_live}).one()
    return row.id is not None, int(row.live), int(row.on_queue)


def party_load(session: Session, tenant_id: str | None, queue: str) -> tuple[int, int]:
    """A tenant's (``None``: the system's) live jobs, and those running or waiting on ``queue``."""
    party = "tenant_id IS NULL" if tenant_id is None else "tenant_id = :tenant"
    row = session.execute(
        text(_LOAD.format(party=party)), {"tenant": tenant_id, "queue": queue}
    ).one()
    return int(row.live), int(row.on_queue)


# --- running --------------------------------------------------------------------------------

# One statement: lock the row, remember its state, and move it to active if it is
# waiting (or active with a lock that ran out: a stalled run, counted as such).
# The conditions read the locked row (``before``), not the statement's snapshot: a
# promoter publishes inside its transaction, so a delivery can arrive while the row
# is still delayed in that snapshot; the lock waits for the promoter's commit, and
# ``before`` then holds the row as committed (the update itself follows it there).
_CLAIM = text(
    """
    WITH before AS (SELECT id, state, locked_until FROM jobs WHERE id = :id FOR UPDATE)
    UPDATE jobs SET
        stalled_count = jobs.stalled_count + CASE WHEN before.state = 'active' THEN 1 ELSE 0 END,
        state = 'active',
        attempts_started = jobs.attempts_started + 1,
        processed_on = clock_timestamp(),
        lock_token = :token,
        locked_until = clock_timestamp() + make_interval(secs => :lock_s),
        celery_ctx = COALESCE(CAST(:ctx AS jsonb), jobs.celery_ctx),
        runs = jobs.runs || jsonb_build_array(jsonb_build_object(
            'attempt', jobs.attempts_started + 1,
            'startedAt', to_char(clock_timestamp() AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'worker', CAST(:worker AS text)))
    FROM before
    WHERE jobs.id = before.id
      AND (before.state = 'waiting'
           OR (before.state = 'active' AND before.locked_until < clock_timestamp()))
    RETURNING jobs.id, jobs.name, jobs.queue, jobs.data, jobs.opts, jobs.tenant_id,
              jobs.user_id, jobs.attempts_made, jobs.attempts_started, jobs.celery_ctx,
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
    """``claim`` as its own statement, without a Session (``tasks.db.run_alone``): a
    recorded job's delivery, the hot path."""
    return _claimed(run_alone(_CLAIM, _claim_params(job_id, token, lock_s, worker, ctx)), token)


def _claim_params(
    job_id: str, token: str, lock_s: float, worker: str, ctx: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": job_id,
        "token": token,
        "lock_s": lock_s,
        "worker": worker,
        "ctx": json.dumps(ctx) if ctx else None,
    }


def _claimed(row: Any, token: str) -> ClaimedJob | None:
    if row is None:
        return None
    return ClaimedJob(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        data=row["data"],
        opts=JobOptions.from_stored(row["opts"]),
        tenant_id=row["tenant_id"],
        user_id=row["user_id"],
        attempts_made=row["attempts_made"],
        attempts_started=row["attempts_started"],
        stalled=bool(row["stalled"]),
        token=token,
        wait_s=max(0.0, float(row["wait_s"] or 0)),
        celery_ctx=row["celery_ctx"],
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


_COMPLETE = text(
    f"""
    UPDATE jobs SET state = 'completed', result = CAST(:result AS jsonb),
        finished_on = clock_timestamp(), lock_token = NULL, locked_until = NULL,
        {_FINISH_RUN}
    WHERE id = :id AND lock_token = :token
    RETURNING id
    """
)
_COMPLETED_RUN = json.dumps({"outcome": "completed"})


def _complete_params(job: ClaimedJob, result: Any) -> dict[str, Any]:
    return {
        "id": job.id,
        "token": job.token,
        "result": json.dumps(result),
        "run_patch": _COMPLETED_RUN,
    }


def complete(session: Session, job: ClaimedJob, result: Any) -> bool:
    """Record success; ``False`` if the job is no longer ours."""
    return session.execute(_COMPLETE, _complete_params(job, result)).first() is not None


def complete_alone(job: ClaimedJob, result: Any) -> bool:
    """``complete`` as its own statement, without a Session (``tasks.db.run_alone``)."""
    return run_alone(_COMPLETE, _complete_params(job, result)) is not None


def fail(
    session: Session,
    job: ClaimedJob,
    reason: str,
    stack: list[str],
    retry_in_ms: int | None,
    data: dict[str, Any] | None = None,
) -> FailedRun:
    """Record a failed run: ``retry_in_ms`` set → delayed until then, else failed for good.

    ``data`` replaces the job's data for its next run (only when it runs again).
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
            WHERE id = :id AND lock_token = :token
            RETURNING run_at
            """
        ),
        {
            "id": job.id,
            "token": job.token,
            "reason": reason,
            "stack": json.dumps(stack[-10:]),
            "retrying": retrying,
            "data": json.dumps(data) if data is not None else None,
            "delay_s": (retry_in_ms or 0) / 1000.0,
            "run_patch": json.dumps(
                {"outcome": "retrying" if retrying else "failed", "error": reason}
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
            WHERE id = :id AND lock_token = :token
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


_ARCHIVE = """
    WITH gone AS ({delete} RETURNING *)
    INSERT INTO failed_jobs_archive (id, queue, name, data, opts, tenant_id, user_id,
        attempts_made, attempts_started, failed_reason, stacktrace, runs, created_at, finished_on)
    SELECT id, queue, name, data, opts, tenant_id, user_id, attempts_made, attempts_started,
        failed_reason, stacktrace, runs, created_at, finished_on FROM gone
    ON CONFLICT (id) DO UPDATE SET failed_reason = EXCLUDED.failed_reason,
        runs = EXCLUDED.runs, finished_on = EXCLUDED.finished_on, archived_at = now()
"""


@dataclass(frozen=True)
class Partition:
    """Whose finished records a retention setting counts: a tenant's, or one system job's."""

    queue: str
    tenant_id: str | None
    name: str

    @property
    def where(self) -> str:
        if self.tenant_id is not None:
            return "queue = :queue AND tenant_id = :tenant AND state = :state"
        return "queue = :queue AND tenant_id IS NULL AND name = :name AND state = :state"


def trim(
    session: Session, partition: Partition, state: State, count: int | None, age_s: int | None
) -> int:
    """Delete the partition's records in ``state`` beyond the newest ``count`` or older than
    ``age_s``; failed ones are copied to the archive by the same statement."""
    deletes = []
    if count is not None:
        # Only the rows past the newest ``count`` are locked (a lock under the OFFSET would
        # take every row of the partition): two trims at once skip each other's rows and
        # never touch the rows they both keep.
        deletes.append(
            f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE id IN ("
            f"SELECT id FROM jobs WHERE {partition.where} "
            "ORDER BY finished_on DESC OFFSET :count) FOR UPDATE SKIP LOCKED)"
        )
    if age_s is not None:
        deletes.append(
            f"DELETE FROM jobs WHERE {partition.where} "
            "AND finished_on < clock_timestamp() - make_interval(secs => :age)"
        )
    params = {
        "queue": partition.queue,
        "tenant": partition.tenant_id,
        "name": partition.name,
        "state": state,
        "count": count,
        "age": age_s,
    }
    removed = 0
    for delete in deletes:
        statement = _ARCHIVE.format(delete=delete) if state == State.FAILED else delete
        removed += affected(session.execute(text(statement), params))
    return removed


# --- waking up ------------------------------------------------------------------------------


def promote_due(session: Session, limit: int = 200) -> list[ReadyJob]:
    """Delayed jobs whose time has come → waiting, oldest first (the caller publishes them)."""
    rows = session.execute(
        text(
            """
            UPDATE jobs SET state = 'waiting'
            WHERE id IN (SELECT id FROM jobs
                         WHERE state IN ('delayed', 'waiting-children')
                           AND run_at <= clock_timestamp()
                         ORDER BY run_at LIMIT :limit FOR UPDATE SKIP LOCKED)
            RETURNING id, name, queue, data, celery_ctx, tenant_id, run_at
            """
        ),
        {"limit": limit},
    ).all()
    rows = sorted(rows, key=lambda r: r.run_at)  # RETURNING keeps no order
    return [ready_job(r) for r in rows]


STALLED_TOO_OFTEN = "job stalled more than allowable limit"


def requeue_stalled(session: Session, max_stalled: int, limit: int = 200) -> list[ReadyJob]:
    """Active jobs whose lock ran out → waiting again, or failed past ``max_stalled`` stalls."""
    rows = session.execute(
        text(
            f"""
            UPDATE jobs SET
                stalled_count = stalled_count + 1,
                state = CASE WHEN stalled_count + 1 > :max THEN 'failed' ELSE 'waiting' END,
                failed_reason = CASE WHEN stalled_count + 1 > :max THEN :reason
                                     ELSE failed_reason END,
                finished_on = CASE WHEN stalled_count + 1 > :max THEN clock_timestamp() END,
                lock_token = NULL, locked_until = NULL,
                runs = jsonb_set(runs, ARRAY[(jsonb_array_length(runs) - 1)::text],
                                 (runs -> -1) || jsonb_build_object('outcome', 'stalled',
                                                                    'finishedAt', {_NOW_ISO}))
            WHERE id IN (SELECT id FROM jobs
                         WHERE state = 'active' AND locked_until < clock_timestamp()
                         LIMIT :limit FOR UPDATE SKIP LOCKED)
            RETURNING id, name, queue, data, opts, state, celery_ctx, tenant_id
            """
        ),
        {"max": max_stalled, "reason": STALLED_TOO_OFTEN, "limit": limit},
    ).all()
    return [ready_job(r, state=State(r.state), opts=r.opts) for r in rows]


def waiting_after(session: Session, after_id: str, limit: int) -> list[ReadyJob]:
    """Waiting jobs in id order after ``after_id`` (to republish them all, a page at a time)."""
    rows = session.execute(
        text(
            "SELECT id, name, queue, data, celery_ctx, tenant_id FROM jobs "
            "WHERE state = 'waiting' AND id > :after ORDER BY id LIMIT :limit"
        ),
        {"after": after_id, "limit": limit},
    ).all()
    return [ready_job(r) for r in rows]


# --- cancelling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelledJob(Job):
    """A job just cancelled: what finishing it needs (dedup claim, retention by its opts)."""

    opts: dict[str, Any]
    user_id: str | None
    celery_ctx: dict[str, Any] | None = None


# Like _PARK, the state is tested on the row as locked, not in the statement's snapshot: a
# promoter publishes inside its transaction, so the row may be committed as waiting (and
# its message be on its way) after this statement began; the claim then finds it cancelled.
# Rows are locked in id order: two workers cancelling the same revoked ids never deadlock.
_CANCEL = text(
    """
    WITH before AS (SELECT id, state FROM jobs WHERE id = ANY(:ids) ORDER BY id FOR UPDATE)
    UPDATE jobs SET state = 'cancelled', finished_on = clock_timestamp(),
        lock_token = NULL, locked_until = NULL
    FROM before WHERE jobs.id = before.id AND before.state = ANY(:states)
    RETURNING jobs.id, jobs.name, jobs.queue, jobs.data, jobs.opts, jobs.tenant_id, jobs.user_id,
        jobs.celery_ctx
    """
)


def cancel(session: Session, job_ids: Sequence[str], states: Sequence[State]) -> list[CancelledJob]:
    """Cancel those of ``job_ids`` whose (locked) row is in one of ``states``; the ones it did."""
    if not job_ids:
        return []
    rows = session.execute(_CANCEL, {"ids": list(job_ids), "states": [str(s) for s in states]})
    return [
        CancelledJob(
            id=row.id,
            name=row.name,
            queue=row.queue,
            data=row.data,
            tenant_id=row.tenant_id,
            opts=row.opts,
            user_id=row.user_id,
            celery_ctx=row.celery_ctx,
        )
        for row in rows
    ]


# --- operators ------------------------------------------------------------------------------


def lock(session: Session, job_id: str) -> JobRecord | None:
    """The job, its row locked until the transaction ends (concurrent retries queue here)."""
    query = select(JobRecord).where(JobRecord.id == job_id).with_for_update()
    return session.scalars(query).first()


def was_retried(session: Session, job_id: str) -> bool:
    return bool(session.scalar(select(exists().where(RetryAudit.job_id == job_id))))


def record_audit(session: Session, audit: RetryAudit) -> None:
    """The audit row of a manual retry, written (flushed) before anything is cleared."""
    session.add(audit)
    session.flush()


def reset_for_retry(session: Session, job_id: str) -> None:
    """A manual retry: full attempts again, failure fields cleared (audited first)."""
    session.execute(
        text(
            """
            UPDATE jobs SET state = 'waiting', attempts_made = 0, attempts_started = 0,
                stalled_count = 0, failed_reason = NULL, stacktrace = '[]'::jsonb,
                result = NULL, progress = NULL, processed_on = NULL, finished_on = NULL,
                lock_token = NULL, locked_until = NULL,
                runs = runs || jsonb_build_array(jsonb_build_object('outcome', 'manual-retry'))
            WHERE id = :id
            """
        ),
        {"id": job_id},
    )


def get(session: Session, job_id: str) -> JobRecord | None:
    return session.get(JobRecord, job_id)


# --- reconciling with the broker --------------------------------------------------------------

# A waiting job's message went out when it became waiting: at its insert, its promotion
# (at or after ``run_at``) or a requeue after a claim (``processed_on``). The latest of
# these is a lower bound of its last publish, so "older than" never picks a fresh add.
_LAST_MOVE = "GREATEST(created_at, run_at, processed_on)"


def queues_with_waiting(session: Session, older_than_s: float) -> list[str]:
    """The queues that hold waiting jobs whose last publish is ``older_than_s`` old or more."""
    rows = session.execute(
        text(
            f"SELECT DISTINCT queue FROM jobs WHERE state = 'waiting' "
            f"AND {_LAST_MOVE} < clock_timestamp() - make_interval(secs => :age) ORDER BY queue"
        ),
        {"age": older_than_s},
    ).scalars()
    return list(rows)


def waiting_since(session: Session, queue: str, older_than_s: float, limit: int) -> list[ReadyJob]:
    """Waiting jobs of ``queue`` published ``older_than_s`` ago or more, longest waiting first."""
    rows = session.execute(
        text(
            f"SELECT id, name, queue, data, celery_ctx, tenant_id FROM jobs "
            f"WHERE state = 'waiting' AND queue = :queue "
            f"AND {_LAST_MOVE} < clock_timestamp() - make_interval(secs => :age) "
            f"ORDER BY {_LAST_MOVE} LIMIT :limit"
        ),
        {"queue": queue, "age": older_than_s, "limit": limit},
    ).all()
    return [ready_job(r) for r in rows]


def still_waiting(session: Session, job_ids: Sequence[str]) -> set[str]:
    """Which of these jobs are waiting now."""
    rows = session.execute(
        text("SELECT id FROM jobs WHERE id = ANY(:ids) AND state = 'waiting'"),
        {"ids": list(job_ids)},
    ).scalars()
    return set(rows)


def chords_held(session: Session) -> list[Any]:
    """The chord callbacks that live jobs will count toward when they finish (one of each)."""
    rows = session.execute(
        text(
            "SELECT DISTINCT celery_ctx -> 'chord' FROM jobs "
            "WHERE state IN ('waiting', 'active', 'delayed', 'waiting-children') "
            "AND jsonb_typeof(celery_ctx -> 'chord') = 'object'"
        )
    ).scalars()
    return list(rows)
