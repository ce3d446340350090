"""State transitions of job records, each one atomic statement.

Every transition a worker makes is guarded by the lock token it got when it
claimed the job, so a worker that lost its job (stalled, then picked up
elsewhere) cannot overwrite what the new owner records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from tasks.jobs.models import JobRecord


@dataclass(frozen=True)
class ClaimedJob:
    """What a worker knows about a job it is about to run."""

    id: str
    name: str
    queue: str
    data: dict[str, Any]
    opts: dict[str, Any]
    tenant_id: str | None
    user_id: str | None
    attempts_made: int
    attempts_started: int
    stalled: bool
    token: str
    wait_s: float = 0.0


_CLAIM = text(
    """
    UPDATE jobs SET
        stalled_count = stalled_count + CASE WHEN state = 'active' THEN 1 ELSE 0 END,
        state = 'active',
        attempts_started = attempts_started + 1,
        processed_on = clock_timestamp(),
        lock_token = :token,
        locked_until = clock_timestamp() + make_interval(secs => :lock_s),
        celery_ctx = COALESCE(CAST(:ctx AS jsonb), celery_ctx),
        runs = runs || jsonb_build_array(jsonb_build_object(
            'attempt', attempts_started + 1,
            'startedAt', to_char(clock_timestamp() AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'worker', CAST(:worker AS text)))
    WHERE id = :id
      AND (state = 'waiting'
           OR (state = 'active' AND locked_until < clock_timestamp()))
    RETURNING id, name, queue, data, opts, tenant_id, user_id,
              attempts_made, attempts_started, stalled_count,
              EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(run_at, created_at)) AS wait_s
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
    before = session.execute(
        text("SELECT state FROM jobs WHERE id = :id FOR UPDATE"), {"id": job_id}
    ).scalar()
    if before is None:
        return None
    row = (
        session.execute(
            _CLAIM,
            {
                "id": job_id,
                "token": token,
                "lock_s": lock_s,
                "worker": worker,
                "ctx": json.dumps(ctx) if ctx else None,
            },
        )
        .mappings()
        .first()
    )
    if row is None:
        return None
    return ClaimedJob(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        data=row["data"],
        opts=row["opts"],
        tenant_id=row["tenant_id"],
        user_id=row["user_id"],
        attempts_made=row["attempts_made"],
        attempts_started=row["attempts_started"],
        stalled=before == "active",
        token=token,
        wait_s=max(0.0, float(row["wait_s"] or 0)),
    )


_NOW_ISO = """to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
_FINISH_RUN = f"""
    runs = jsonb_set(runs, ARRAY[(jsonb_array_length(runs) - 1)::text],
                     (runs -> -1) || CAST(:run_patch AS jsonb)
                     || jsonb_build_object('finishedAt', {_NOW_ISO}))
"""


def complete(session: Session, job: ClaimedJob, result: Any) -> bool:
    """Record success; ``False`` if the job is no longer ours."""
    row = session.execute(
        text(
            f"""
            UPDATE jobs SET state = 'completed', result = CAST(:result AS jsonb),
                finished_on = clock_timestamp(), lock_token = NULL, locked_until = NULL,
                {_FINISH_RUN}
            WHERE id = :id AND lock_token = :token
            RETURNING id
            """
        ),
        {
            "id": job.id,
            "token": job.token,
            "result": json.dumps(result),
            "run_patch": json.dumps({"outcome": "completed"}),
        },
    ).first()
    return row is not None


def fail(
    session: Session,
    job: ClaimedJob,
    reason: str,
    stack: list[str],
    retry_in_ms: int | None,
) -> datetime | bool | None:
    """Record a failed run: ``retry_in_ms`` set → delayed until then, else failed for good.

    Returns the time of the next run, ``None`` when failed for good, or
    ``False`` when the job is no longer ours.
    """
    retrying = retry_in_ms is not None
    row = session.execute(
        text(
            f"""
            UPDATE jobs SET
                attempts_made = attempts_made + 1,
                failed_reason = :reason,
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
            "delay_s": (retry_in_ms or 0) / 1000.0,
            "run_patch": json.dumps(
                {"outcome": "retrying" if retrying else "failed", "error": reason}
            ),
        },
    ).first()
    if row is None:
        return False
    return row[0] if retrying else None


def defer(session: Session, job: ClaimedJob, delay_ms: int, state: str, reason: str) -> bool:
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


def fail_unsupported(session: Session, job_id: str, name: str) -> bool:
    """A message no worker has a handler for: failed at once, as a run that failed."""
    reason = f"unsupported job: {name}"
    row = session.execute(
        text(
            """
            UPDATE jobs SET state = 'failed', failed_reason = :reason,
                attempts_made = attempts_made + 1, attempts_started = attempts_started + 1,
                processed_on = clock_timestamp(), finished_on = clock_timestamp(),
                runs = runs || jsonb_build_array(jsonb_build_object(
                    'attempt', attempts_started + 1, 'outcome', 'failed',
                    'error', CAST(:reason AS text)))
            WHERE id = :id AND state IN ('waiting', 'active')
            RETURNING id
            """
        ),
        {"id": job_id, "reason": reason},
    ).first()
    return row is not None


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
    """Heartbeat: push the lock of every job this process runs further out."""
    if not tokens:
        return 0
    result = session.execute(
        text(
            "UPDATE jobs SET locked_until = clock_timestamp() + make_interval(secs => :lock_s) "
            "WHERE lock_token = ANY(:tokens) AND state = 'active'"
        ),
        {"tokens": tokens, "lock_s": lock_s},
    )
    return result.rowcount or 0


@dataclass(frozen=True)
class DueJob:
    id: str
    name: str
    queue: str
    data: dict[str, Any]
    celery_ctx: dict[str, Any] | None = None
    tenant_id: str | None = None


def promote_due(session: Session, limit: int = 200) -> list[DueJob]:
    """Delayed jobs whose time has come → waiting (the caller then publishes them)."""
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
    rows = sorted(rows, key=lambda r: r.run_at)  # RETURNING keeps no order: publish oldest first
    return [DueJob(r.id, r.name, r.queue, r.data, r.celery_ctx, r.tenant_id) for r in rows]


@dataclass(frozen=True)
class StalledJob:
    id: str
    name: str
    queue: str
    data: dict[str, Any]
    opts: dict[str, Any]
    state: str
    celery_ctx: dict[str, Any] | None = None
    tenant_id: str | None = None


STALLED_TOO_OFTEN = "job stalled more than allowable limit"


def requeue_stalled(session: Session, max_stalled: int, limit: int = 200) -> list[StalledJob]:
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
    return [StalledJob(r.id, r.name, r.queue, r.data, r.opts, r.state, r.celery_ctx, r.tenant_id)
            for r in rows]  # fmt: skip


def get(session: Session, job_id: str) -> JobRecord | None:
    return session.scalars(select(JobRecord).where(JobRecord.id == job_id)).first()
