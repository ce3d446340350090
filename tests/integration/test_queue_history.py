"""The queue history (``store.stats``, read by ``observe.queue_history``): each end counted
once into its 5-minute and hourly buckets with its wait and run times, whatever retention
deletes afterwards, old buckets pruned by the retention round, each tenant's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.observe.queue_history import history
from tasks.jobs.store import counts
from tasks.jobs.upkeep import retention
from tasks.platform.db import transaction
from tests.support.client import record, unique, wait_state

pytestmark = pytest.mark.usefixtures("inline_worker")


def run(tenant: str, name: str, data: dict, state: str) -> dict:
    job = add(name, data, queue="default", opts=JobOptions(attempts=1), owner=Owner(tenant, "a"))
    wait_state(job.job_id, state)
    return record(job.job_id)


def stored(tenant: str) -> dict[int, list[tuple]]:
    """The tenant's stored buckets per resolution: (bucket, completed, failed, timed,
    wait sum, wait max, run sum, run max)."""
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT step_s, bucket, completed, failed, timed, wait_ms_sum, wait_ms_max, "
                "run_ms_sum, run_ms_max FROM job_stats WHERE tenant_id = :t AND queue = 'default' "
                "ORDER BY step_s, bucket"
            ),
            {"t": tenant},
        ).all()
    found: dict[int, list[tuple]] = {}
    for step, *rest in rows:
        found.setdefault(step, []).append(tuple(rest))
    return found


def totals(tenant: str, span: str = "hour") -> tuple[int, int]:
    series = history(tenant, span).queues.get("default", [])
    return sum(b.completed for b in series), sum(b.failed for b in series)


def floor(at: datetime, step_s: int) -> datetime:
    return datetime.fromtimestamp(int(at.timestamp()) // step_s * step_s, UTC)


def test_ends_are_counted_once_into_their_buckets_with_their_times_and_tenant():
    # Given three jobs of acme that complete (each runs >= 60 ms), two that fail, and one of globex
    acme, globex = unique("hist-acme"), unique("hist-globex")
    done = [run(acme, "test.sleep", {"ms": 60}, "completed") for _ in range(3)]
    failed = [run(acme, "test.unrecoverable", {}, "failed") for _ in range(2)]
    run(globex, "test.echo", {}, "completed")
    # When the counts are compacted (any worker's maintenance does it; twice changes nothing)
    before = totals(acme)
    counts.compact()
    counts.compact()
    # Then each resolution holds every end once, in the buckets of their finish times
    found = stored(acme)
    ends = [r["finishedOn"] for r in done + failed]
    for step in (300, 3600):
        buckets = {floor(datetime.fromisoformat(at.replace("Z", "+00:00")), step) for at in ends}
        assert {row[0] for row in found[step]} == buckets
        assert sum(row[1] for row in found[step]) == 3
        assert sum(row[2] for row in found[step]) == 2
        assert sum(row[3] for row in found[step]) == 5
        assert sum(row[6] for row in found[step]) >= 3 * 60  # run time: each slept 60 ms
        assert max(row[7] for row in found[step]) >= 60
        assert min(row[4] for row in found[step]) >= 0  # wait time: due to started
    # And reading the history gives the same before and after compaction (pending ends count)
    assert before == totals(acme) == (3, 2)
    for span in ("day", "week"):
        assert totals(acme, span) == (3, 2)
    series = history(acme).queues["default"]
    assert sum(b.timed for b in series) == 5
    assert max(b.run_max_s or 0 for b in series) >= 0.06
    # And each tenant sees its own ends only
    assert totals(globex) == (1, 0)
    assert list(history(unique("hist-nobody")).queues) == []


def test_the_history_outlives_the_records_that_retention_deletes():
    # Given ends of a tenant, compacted or not
    tenant = unique("hist-kept")
    ids = [run(tenant, "test.echo", {"n": i}, "completed")["jobId"] for i in range(2)]
    counts.compact()
    ids.append(run(tenant, "test.always_fails", {}, "failed")["jobId"])
    # When retention deletes every record of it (a count rule trims at each end the same way)
    with transaction() as session:
        session.execute(text("DELETE FROM jobs WHERE tenant_id = :t"), {"t": tenant})
    assert all(record(job_id) is None for job_id in ids)
    counts.compact()
    # Then the history still holds every end, once
    assert totals(tenant) == (2, 1) == totals(tenant, "week")
    assert sum(row[1] + row[2] for row in stored(tenant)[300]) == 3


def test_buckets_past_their_time_are_pruned_by_the_retention_round():
    # Given buckets of each resolution, some past their time (a day; 8 days)
    tenant = unique("hist-old")
    now = datetime.now(UTC)
    rows = {
        (300, now - timedelta(hours=25)): False,
        (300, now - timedelta(hours=20)): True,
        (3600, now - timedelta(days=9)): False,
        (3600, now - timedelta(days=6)): True,
    }
    with transaction() as session:
        for step, at in rows:
            session.execute(
                text(
                    "INSERT INTO job_stats (tenant_id, step_s, bucket, queue, completed) "
                    "VALUES (:t, :s, :b, 'default', 1)"
                ),
                {"t": tenant, "s": step, "b": floor(at, step)},
            )
    # When a retention round runs
    retention.sweep()
    # Then only the buckets within their time are left
    left = {(step, row[0]) for step, found in stored(tenant).items() for row in found}
    assert left == {(step, floor(at, step)) for (step, at), kept in rows.items() if kept}
    # And the week's view reads the hourly bucket of 6 days ago (the day's, 20 hours ago)
    assert totals(tenant, "week") == (1, 0)
    assert totals(tenant, "day") == (1, 0)
    assert totals(tenant, "hour") == (0, 0)
