"""A tenant's queues over the last hour, day or week: ends, failures, wait and run times.

Read from the queue history (``tasks.jobs.store.stats``), which is counted as jobs end and
kept apart from the records, so retention does not shorten it: the hour in 5-minute
buckets, the day in 30-minute buckets (from the 5-minute ones), the week in 6-hour buckets
(from the hourly ones). The newest bucket is the one still under way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from tasks.jobs.store import stats
from tasks.platform.db import transaction


@dataclass(frozen=True)
class Span:
    """A range the history is read over: its length, the stored buckets it sums, and the
    buckets it shows."""

    window_s: int
    source_s: int
    step_s: int

    @property
    def count(self) -> int:
        return self.window_s // self.step_s


SPANS = {
    "hour": Span(3_600, 300, 300),
    "day": Span(86_400, 300, 1_800),
    "week": Span(7 * 86_400, 3_600, 21_600),
}


@dataclass(frozen=True)
class Bucket:
    """A queue's ends in one bucket; times in seconds, ``None`` with no timed run."""

    start: datetime
    completed: int = 0
    failed: int = 0
    timed: int = 0
    wait_avg_s: float | None = None
    wait_max_s: float | None = None
    run_avg_s: float | None = None
    run_max_s: float | None = None


@dataclass(frozen=True)
class History:
    """Each queue's buckets over ``span`` (oldest first, every bucket present)."""

    span: str
    since: datetime
    step_s: int
    queues: dict[str, list[Bucket]]


def _start(now: datetime, span: Span) -> datetime:
    """The first bucket's start: the current bucket's, ``count - 1`` buckets earlier."""
    current = int(now.timestamp()) // span.step_s * span.step_s
    return datetime.fromtimestamp(current - (span.count - 1) * span.step_s, UTC)


def history(tenant_id: str, span_name: str = "hour") -> History:
    """``tenant_id``'s queues over ``span_name`` (``hour``, ``day`` or ``week``)."""
    span = SPANS[span_name]
    with transaction() as session:
        now = session.scalar(text("SELECT clock_timestamp()"))
        since = _start(now, span)
        rows = stats.buckets(session, tenant_id, since, span.source_s, span.step_s)
    step = timedelta(seconds=span.step_s)
    empty = [Bucket(since + i * step) for i in range(span.count)]
    found: dict[str, list[Bucket]] = {}
    for queue, start, done, failed, timed, wait_sum, wait_max, run_sum, run_max in rows:
        index = int((start - since) / step)
        if not 0 <= index < span.count:
            continue
        found.setdefault(queue, list(empty))[index] = Bucket(
            start,
            done,
            failed,
            timed,
            wait_sum / timed / 1000 if timed else None,
            wait_max / 1000 if timed else None,
            run_sum / timed / 1000 if timed else None,
            run_max / 1000 if timed else None,
        )
    return History(span_name, since, span.step_s, found)
