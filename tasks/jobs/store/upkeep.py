"""Statements on many ``jobs`` records at once: the workers' maintenance and the reconciler.

Delayed jobs due now become waiting (``promote_due``), runs whose lock ran out
are requeued or failed (``requeue_stalled``), finished records are trimmed to
their retention, and the reconciler finds waiting jobs whose message may be
gone. Callers own the transaction and pass the session in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.model.models import State
from tasks.jobs.store.jobs import ReadyJob, ready_job
from tasks.jobs.store.runs import NOW_ISO
from tasks.platform.db import affected

# Statements a delivery makes before (or instead of) its claim lock the row by id first
# and test its state there, like the claim: the delivery may come from a promoter whose
# transaction has not committed yet (see ``runs._CLAIM``), and a test against the statement's
# snapshot would find the job still delayed and do nothing.
_PARK = text(
    """
    WITH before AS (SELECT id, state FROM jobs WHERE id = ANY(:ids) FOR UPDATE)
    UPDATE jobs SET state = 'delayed', run_at = clock_timestamp() + make_interval(secs => :s)
    FROM before WHERE jobs.id = before.id AND before.state = 'waiting'
    """
)


def park(session: Session, job_ids: Sequence[str], in_s: float) -> int:
    """Waiting jobs whose message could not be published (or that a limit holds) go back to
    the delayed set, due again in ``in_s`` seconds; how many did."""
    return affected(session.execute(_PARK, {"ids": list(job_ids), "s": in_s}))


# Postgres delivers a NOTIFY when, and only if, the transaction that sent it commits: the
# channel on which a caller's transaction says which jobs it recorded (``tasks.jobs.upkeep.
# committed`` listens, and publishes them).
COMMITTED_CHANNEL = "keel_committed"


def notify_committed(session: Session, job_ids: Sequence[str]) -> None:
    """Tell the workers, once ``session``'s transaction commits, that ``job_ids`` are parked
    for their publish (nothing, if it rolls back): comma-separated, in as many notifications
    as Postgres's payload limit (8,000 bytes) needs."""
    for chunk in _payloads(job_ids):
        session.execute(
            text("SELECT pg_notify(:channel, :ids)"), {"channel": COMMITTED_CHANNEL, "ids": chunk}
        )


def _payloads(job_ids: Sequence[str], limit: int = 7_000) -> list[str]:
    chunks: list[list[str]] = [[]]
    size = 0
    for job_id in job_ids:
        if chunks[-1] and size + len(job_id) + 1 > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(job_id)
        size += len(job_id) + 1
    return [",".join(chunk) for chunk in chunks if chunk]


# A DELETE (``{delete}``, its RETURNING added) whose failed records go to the archive.
ARCHIVE_DELETED = """
    WITH gone AS ({delete} RETURNING *)
    INSERT INTO failed_jobs_archive (id, queue, name, data, opts, tenant_id, user_id,
        attempts_made, attempts_started, failed_reason, stacktrace, runs, created_at, finished_on)
    SELECT id, queue, name, data, opts || COALESCE(extra_opts, '{{}}'::jsonb), tenant_id,
        user_id, attempts_made, attempts_started, failed_reason, stacktrace, runs, created_at,
        finished_on FROM gone
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
            "AND finished_on < (SELECT clock_timestamp()) - make_interval(secs => :age)"
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
        statement = ARCHIVE_DELETED.format(delete=delete) if state == State.FAILED else delete
        removed += affected(session.execute(text(statement), params))
    return removed


# The option that, set on a job, makes its own retention rule (``trim``) for each end.
# (A cancelled job's records follow ``removeOnFail``, as its end's trim does.)
_OWN_RULE = {
    State.COMPLETED: "removeOnComplete",
    State.FAILED: "removeOnFail",
    State.CANCELLED: "removeOnFail",
}


def expire_finished(session: Session, state: State, age_s: int, limit: int = 500) -> int:
    """Delete up to ``limit`` records in ``state`` finished more than ``age_s`` ago whose job
    sets no retention option of its own (the global default's sweep), oldest first; failed
    ones are copied to the archive by the same statement. Rows another transaction holds
    are skipped (the next sweep takes them). Returns how many went."""
    # State and option are literals (of ``_OWN_RULE``, never input), so that the planner
    # matches the partial indexes of migration 0011 (``ix_jobs_expiring_*``).
    delete = (
        f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state = '{state.value}' "
        f"AND NOT (opts ? '{_OWN_RULE[state]}') "
        "AND finished_on < (SELECT clock_timestamp()) - make_interval(secs => :age) "
        "ORDER BY finished_on LIMIT :limit FOR UPDATE SKIP LOCKED)"
    )
    statement = ARCHIVE_DELETED.format(delete=delete) if state == State.FAILED else delete
    return affected(session.execute(text(statement), {"age": age_s, "limit": limit}))


# --- waking up ------------------------------------------------------------------------------


def promote_due(session: Session, limit: int = 200) -> list[ReadyJob]:
    """Delayed jobs whose time has come → waiting, oldest first (the caller publishes them)."""
    rows = session.execute(
        text(
            """
            UPDATE jobs SET state = 'waiting'
            WHERE id IN (SELECT id FROM jobs
                         WHERE state IN ('delayed', 'waiting-children')
                           AND run_at <= (SELECT clock_timestamp())
                         ORDER BY run_at LIMIT :limit FOR UPDATE SKIP LOCKED)
            RETURNING id, name, queue, data, celery_ctx, tenant_id, run_at, priority
            """
        ),
        {"limit": limit},
    ).all()
    rows = sorted(rows, key=lambda r: r.run_at)  # RETURNING keeps no order
    return [ready_job(r) for r in rows]


def promote_now(session: Session, job_ids: Sequence[str]) -> list[ReadyJob]:
    """Those of ``job_ids`` that are parked (delayed) → waiting now, whatever their time; the
    caller publishes them. A job the promoter holds (or took already) is left to it."""
    rows = session.execute(
        text(
            """
            UPDATE jobs SET state = 'waiting'
            WHERE id IN (SELECT id FROM jobs WHERE id = ANY(:ids) AND state = 'delayed'
                         FOR UPDATE SKIP LOCKED)
            RETURNING id, name, queue, data, celery_ctx, tenant_id, run_at, priority
            """
        ),
        {"ids": list(job_ids)},
    ).all()
    return [ready_job(r) for r in rows]


def set_run_at(session: Session, job_id: str, delay_ms: int) -> None:
    """The delayed job is due ``delay_ms`` from now."""
    session.execute(
        text(
            "UPDATE jobs SET run_at = clock_timestamp() + make_interval(secs => :ms / 1000.0) "
            "WHERE id = :id AND state = 'delayed'"
        ),
        {"id": job_id, "ms": delay_ms},
    )


STALLED_TOO_OFTEN = "job stalled more than allowable limit"


def requeue_stalled(session: Session, max_stalled: int, limit: int = 200) -> list[ReadyJob]:
    """Active jobs whose lock ran out → waiting again, or failed past ``max_stalled`` stalls,
    or cancelled if they were being aborted (``tasks.jobs.end.abort``: never run again)."""
    rows = session.execute(
        text(
            f"""
            UPDATE jobs SET
                stalled_count = stalled_count + 1,
                state = CASE WHEN abort_requested_at IS NOT NULL THEN 'cancelled'
                             WHEN stalled_count + 1 > :max THEN 'failed' ELSE 'waiting' END,
                failed_reason = CASE WHEN abort_requested_at IS NULL AND stalled_count + 1 > :max
                                     THEN :reason ELSE failed_reason END,
                finished_on = CASE WHEN abort_requested_at IS NOT NULL OR stalled_count + 1 > :max
                                   THEN clock_timestamp() END,
                lock_token = NULL, locked_until = NULL,
                runs = jsonb_set(runs, ARRAY[(jsonb_array_length(runs) - 1)::text],
                                 (runs -> -1) || jsonb_build_object('outcome', 'stalled',
                                                                    'finishedAt', {NOW_ISO}))
            WHERE id IN (SELECT id FROM jobs
                         WHERE state = 'active' AND locked_until < (SELECT clock_timestamp())
                         LIMIT :limit FOR UPDATE SKIP LOCKED)
            RETURNING id, name, queue, data, opts, state, celery_ctx, tenant_id, priority
            """
        ),
        {"max": max_stalled, "reason": STALLED_TOO_OFTEN, "limit": limit},
    ).all()
    return [ready_job(r, state=State(r.state), opts=r.opts) for r in rows]


# A job held by a paused queue has no message on purpose (``tasks.jobs.intake.pauses``).
_NOT_HELD = "NOT EXISTS (SELECT 1 FROM held_jobs h WHERE h.job_id = jobs.id)"


def waiting_after(session: Session, after_id: str, limit: int) -> list[ReadyJob]:
    """Waiting jobs in id order after ``after_id`` (to republish them all, a page at a time)."""
    rows = session.execute(
        text(
            "SELECT id, name, queue, data, celery_ctx, tenant_id, priority FROM jobs "
            f"WHERE state = 'waiting' AND id > :after AND {_NOT_HELD} ORDER BY id LIMIT :limit"
        ),
        {"after": after_id, "limit": limit},
    ).all()
    return [ready_job(r) for r in rows]


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
            f"AND {_LAST_MOVE} < (SELECT clock_timestamp()) - make_interval(secs => :age)"
            " ORDER BY queue"
        ),
        {"age": older_than_s},
    ).scalars()
    return list(rows)


def waiting_since(session: Session, queue: str, older_than_s: float, limit: int) -> list[ReadyJob]:
    """Waiting jobs of ``queue`` published ``older_than_s`` ago or more, longest waiting first."""
    rows = session.execute(
        text(
            f"SELECT id, name, queue, data, celery_ctx, tenant_id, priority FROM jobs "
            f"WHERE state = 'waiting' AND queue = :queue AND {_NOT_HELD} "
            f"AND {_LAST_MOVE} < (SELECT clock_timestamp()) - make_interval(secs => :age) "
            f"ORDER BY {_LAST_MOVE} LIMIT :limit"
        ),
        {"queue": queue, "age": older_than_s, "limit": limit},
    ).all()
    return [ready_job(r) for r in rows]


def still_waiting(session: Session, job_ids: Sequence[str]) -> set[str]:
    """Which of these jobs are waiting now (and not held by a pause: they have no message)."""
    rows = session.execute(
        text(f"SELECT id FROM jobs WHERE id = ANY(:ids) AND state = 'waiting' AND {_NOT_HELD}"),
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
