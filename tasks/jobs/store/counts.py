"""Jobs per state without scanning the jobs table.

Triggers append deltas to ``job_count_deltas``: ``±1`` for each state change,
and one ``±n`` row per queue, tenant and state for each statement that
inserts or deletes jobs (a bulk add of 10,000 writes one or two); ``compact`` folds
them into ``job_counts`` (one compactor at a time, by advisory lock; the same statement
folds the ends they carry into the queue history, ``stats``), and
readers add the compacted counts to whatever deltas are still pending. The
cost of a read stays flat however many records the queue holds. Counts are
kept per tenant (``""`` for system jobs), so a tenant's view counts only its
own jobs; a queue's total sums its tenants.
"""

from __future__ import annotations

from sqlalchemy import text

from tasks.jobs.model.models import STATES
from tasks.jobs.store import stats
from tasks.platform.db import affected, transaction

_COMPACT_LOCK = 0x6B65656C  # "keel"


def compact(max_rows: int = 50_000) -> int:
    """Fold pending deltas into the counts; returns how many were folded."""
    with transaction() as session:
        if not session.execute(
            text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _COMPACT_LOCK}
        ).scalar():
            return 0
        return affected(
            session.execute(
                text(
                    f"""
                WITH folded AS (
                    DELETE FROM job_count_deltas WHERE id IN (
                        SELECT id FROM job_count_deltas ORDER BY id LIMIT :max)
                    RETURNING queue, tenant_id, state, n, finished_on, wait_ms, run_ms),
                {stats.FOLDED},
                summed AS (SELECT queue, tenant_id, state, sum(n) AS n FROM folded
                           GROUP BY queue, tenant_id, state)
                INSERT INTO job_counts (queue, tenant_id, state, n)
                SELECT queue, tenant_id, state, n FROM summed
                ON CONFLICT (queue, tenant_id, state) DO UPDATE SET n = job_counts.n + EXCLUDED.n
                """
                ),
                {"max": max_rows},
            )
        )


def counts(queue: str, tenant_id: str | None = None) -> dict[str, int]:
    """Jobs per state in ``queue`` (only ``tenant_id``'s if given), exact as of this transaction."""
    mine = "" if tenant_id is None else " AND tenant_id = :tenant"
    with transaction() as session:
        rows = session.execute(
            text(
                f"""
                SELECT state, sum(n) FROM (
                    SELECT state, n FROM job_counts WHERE queue = :queue{mine}
                    UNION ALL
                    SELECT state, n FROM job_count_deltas WHERE queue = :queue{mine}
                ) AS all_counts
                GROUP BY state
                """
            ),
            {"queue": queue, "tenant": tenant_id},
        ).all()
    found: dict[str, int] = dict.fromkeys(STATES, 0)
    found.update({state: int(n) for state, n in rows})
    return found


def by_queue(tenant_id: str) -> dict[str, dict[str, int]]:
    """Jobs per state of each queue the tenant has jobs on (``counts`` for every queue at once)."""
    return _by_queue("WHERE tenant_id = :tenant", {"tenant": tenant_id})


def by_queue_of_every_tenant() -> dict[str, dict[str, int]]:
    """Jobs per state of each queue, every tenant's and the system's summed: the platform
    role's and the system's scope, never a tenant's."""
    return _by_queue("", {})


def _by_queue(where: str, params: dict[str, str]) -> dict[str, dict[str, int]]:
    with transaction() as session:
        rows = session.execute(
            text(
                f"""
                SELECT queue, state, sum(n) FROM (
                    SELECT queue, state, n FROM job_counts {where}
                    UNION ALL
                    SELECT queue, state, n FROM job_count_deltas {where}
                ) AS all_counts
                GROUP BY queue, state
                HAVING sum(n) <> 0
                """
            ),
            params,
        ).all()
    found: dict[str, dict[str, int]] = {}
    for queue, state, n in rows:
        found.setdefault(queue, dict.fromkeys(STATES, 0))[state] = int(n)
    return dict(sorted(found.items()))


def due_delayed(queues: list[str]) -> dict[str, int]:
    """Delayed jobs per queue whose time has come and that no one promoted yet (read
    through ``ix_jobs_due``: only due rows are visited)."""
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT queue, count(*) FROM jobs WHERE state = 'delayed' "
                "AND run_at <= (SELECT clock_timestamp()) AND queue = ANY(:queues) GROUP BY queue"
            ),
            {"queues": queues},
        ).all()
    found = dict.fromkeys(queues, 0)
    found.update({queue: int(n) for queue, n in rows})
    return found


def oldest_waiting_s(queues: list[str]) -> dict[str, float]:
    """Per queue with waiting jobs, how long its oldest has waited since it became due
    (``ix_jobs_waiting_since``: one index probe per queue)."""
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT q.queue, EXTRACT(EPOCH FROM clock_timestamp() - ("
                "  SELECT min(COALESCE(run_at, created_at)) FROM jobs"
                "  WHERE jobs.queue = q.queue AND state = 'waiting')) AS age "
                "FROM unnest(CAST(:queues AS text[])) AS q(queue)"
            ),
            {"queues": queues},
        ).all()
    return {queue: max(0.0, float(age)) for queue, age in rows if age is not None}
