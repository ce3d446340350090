"""Each queue's history: finished runs per tenant in buckets of time, for a bounded time.

The job records cannot tell a day or a week: retention deletes them (``removeOnComplete``
at each end, the default ages every round). So the history is counted as jobs end, the way
``counts`` counts states: the trigger's ``+1`` row of a change into ``completed`` or
``failed`` carries when the job finished and its wait (due → started) and run (started →
finished) times, and ``counts.compact`` folds those rows into ``job_stats`` (``FOLDED``) in
the statement that deletes them — each end counted once, however many workers compact,
and a job's end is in the history before its record can be trimmed. A job's end pays no
statement of its own for it.

Two resolutions (``KEPT``): 5-minute buckets for a day and hourly buckets for 8 days.
``prune`` (the retention round) deletes older ones, so the table holds at most
288 + 192 = 480 rows per (tenant, queue) — plus one retention interval's worth.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.platform.db import affected

# Bucket length (seconds) -> how long its buckets are kept (seconds).
KEPT = {300: 86_400, 3_600: 8 * 86_400}
# Buckets start at whole multiples of their length since this time (UTC midnight).
ORIGIN = "2000-01-01 00:00:00+00"

_STEPS = ", ".join(f"({step})" for step in KEPT)

# A CTE of ``counts.compact``'s statement: the ends among the deltas it deletes (``folded``),
# added to their buckets of each resolution.
FOLDED = f"""
    stats AS (
        INSERT INTO job_stats (tenant_id, step_s, bucket, queue, completed, failed, timed,
                               wait_ms_sum, wait_ms_max, run_ms_sum, run_ms_max)
        SELECT tenant_id, step_s,
               date_bin(make_interval(secs => step_s), finished_on, TIMESTAMPTZ '{ORIGIN}'),
               queue, count(*) FILTER (WHERE state = 'completed'),
               count(*) FILTER (WHERE state = 'failed'), count(run_ms),
               COALESCE(sum(wait_ms), 0), COALESCE(max(wait_ms), 0),
               COALESCE(sum(run_ms), 0), COALESCE(max(run_ms), 0)
        FROM folded CROSS JOIN (VALUES {_STEPS}) AS steps(step_s)
        WHERE finished_on IS NOT NULL AND n > 0
        GROUP BY 1, 2, 3, 4
        ON CONFLICT (tenant_id, step_s, bucket, queue) DO UPDATE SET
            completed = job_stats.completed + EXCLUDED.completed,
            failed = job_stats.failed + EXCLUDED.failed,
            timed = job_stats.timed + EXCLUDED.timed,
            wait_ms_sum = job_stats.wait_ms_sum + EXCLUDED.wait_ms_sum,
            wait_ms_max = GREATEST(job_stats.wait_ms_max, EXCLUDED.wait_ms_max),
            run_ms_sum = job_stats.run_ms_sum + EXCLUDED.run_ms_sum,
            run_ms_max = GREATEST(job_stats.run_ms_max, EXCLUDED.run_ms_max)
        RETURNING 1)"""

Row = tuple[str, datetime, int, int, int, int, int, int, int]


def buckets(
    session: Session, tenant_id: str, since: datetime, source_s: int, step_s: int
) -> Sequence[Row]:
    """``(queue, bucket start, completed, failed, timed, wait ms sum, wait ms max, run ms sum,
    run ms max)`` of ``tenant_id``'s ends since ``since`` (a multiple of ``step_s`` from
    ``ORIGIN``), in buckets of ``step_s`` read from the stored buckets of ``source_s``, and
    the ends not yet compacted (so the newest bucket is exact as of this statement)."""
    if source_s not in KEPT or step_s % source_s:
        raise ValueError(f"no {step_s} s buckets from {source_s} s ones")
    rows = session.execute(
        text(
            f"""
            SELECT queue, date_bin(make_interval(secs => :step), at, TIMESTAMPTZ '{ORIGIN}') AS b,
                   sum(completed), sum(failed), sum(timed), sum(wait_sum), max(wait_max),
                   sum(run_sum), max(run_max)
            FROM (
                SELECT queue, bucket AS at, completed, failed, timed, wait_ms_sum AS wait_sum,
                       wait_ms_max AS wait_max, run_ms_sum AS run_sum, run_ms_max AS run_max
                FROM job_stats
                WHERE tenant_id = :tenant AND step_s = :source AND bucket >= :since
                UNION ALL
                SELECT queue, finished_on, (state = 'completed')::int, (state = 'failed')::int,
                       (run_ms IS NOT NULL)::int, COALESCE(wait_ms, 0), COALESCE(wait_ms, 0),
                       COALESCE(run_ms, 0), COALESCE(run_ms, 0)
                FROM job_count_deltas
                WHERE tenant_id = :tenant AND finished_on >= :since AND n > 0
            ) AS ends
            GROUP BY queue, b
            ORDER BY queue, b
            """
        ),
        {"tenant": tenant_id, "since": since, "source": source_s, "step": step_s},
    ).all()
    return [(q, b, *(int(v) for v in values)) for q, b, *values in rows]


def prune(session: Session) -> int:
    """Delete the buckets past their resolution's time; how many went."""
    kept = " OR ".join(
        f"(step_s = {step} AND bucket < clock_timestamp() - make_interval(secs => {age + step}))"
        for step, age in KEPT.items()
    )
    return affected(session.execute(text(f"DELETE FROM job_stats WHERE {kept}")))
