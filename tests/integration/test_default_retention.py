"""The default retention: a job with no retention rule of its own is not kept for ever.

Records are made finished long ago by hand (an UPDATE of ``finished_on``), and the sweep
(``tasks.jobs.upkeep.retention``) runs here against this module's own database.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from tasks.celery import app as celery_app
from tasks.jobs import JobOptions, add
from tasks.jobs.model.models import ArchivedJob, JobRecord, State
from tasks.jobs.store import counts
from tasks.jobs.upkeep import retention
from tasks.platform.broker import redis_client
from tasks.platform.config import reload_settings
from tasks.platform.db import transaction
from tests.support.client import bearer

DAY = 86_400

pytestmark = pytest.mark.usefixtures("stack")  # a fresh database: the sweep reads the whole table


def finished(state: str, ago_s: float, opts: JobOptions | None = None) -> str:
    """A ``test.echo`` record that ended in ``state`` ``ago_s`` seconds ago."""
    # delayed an hour: never published, never run, until it is made finished here
    added = add("test.echo", {"n": 1}, queue="default", opts=opts or JobOptions(delay=3_600_000))
    with transaction() as session:
        session.execute(
            text(
                "UPDATE jobs SET state = :state, run_at = NULL, "
                "finished_on = clock_timestamp() - make_interval(secs => :ago) WHERE id = :id"
            ),
            {"state": state, "ago": ago_s, "id": added.job_id},
        )
    return added.job_id


def present(*job_ids: str) -> set[str]:
    with transaction() as session:
        return set(session.scalars(select(JobRecord.id).where(JobRecord.id.in_(job_ids))))


def archived(*job_ids: str) -> set[str]:
    with transaction() as session:
        return set(session.scalars(select(ArchivedJob.id).where(ArchivedJob.id.in_(job_ids))))


def test_records_past_the_default_ages_go_and_younger_ones_stay():
    old_done, young_done = finished("completed", 2 * DAY), finished("completed", DAY - 600)
    old_failed, young_failed = finished("failed", 8 * DAY), finished("failed", 6 * DAY)
    old_cancelled = finished("cancelled", 8 * DAY)
    assert retention.sweep() >= 3
    assert present(old_done, young_done, old_failed, young_failed, old_cancelled) == {
        young_done,
        young_failed,
    }
    # A failed record goes to the failure archive; a cancelled one has no failure to keep
    assert archived(old_failed, old_cancelled) == {old_failed}


def test_a_job_with_a_rule_of_its_own_keeps_what_its_rule_says():
    kept_for_ever = finished(
        "completed", 30 * DAY, JobOptions(delay=3_600_000, remove_on_complete=False)
    )
    kept_by_count = finished("failed", 30 * DAY, JobOptions(delay=3_600_000, remove_on_fail=100))
    retention.sweep()
    assert present(kept_for_ever, kept_by_count) == {kept_for_ever, kept_by_count}


def test_an_api_job_without_a_rule_is_swept_and_one_with_false_is_kept(client):
    ids = []
    for opts in ({}, {"removeOnComplete": False}):
        response = client.post(
            "/api/v1/jobs",
            json={"name": "test.echo", "data": {"n": 1}, "opts": {"delay": 3_600_000, **opts}},
            headers=bearer(),
        )
        assert response.status_code == 202, response.get_json()
        ids.append(response.get_json()["jobId"])
    with transaction() as session:
        session.execute(
            text(
                "UPDATE jobs SET state = 'completed', run_at = NULL, "
                "finished_on = clock_timestamp() - interval '2 days' WHERE id = ANY(:ids)"
            ),
            {"ids": ids},
        )
    retention.sweep()
    assert present(*ids) == {ids[1]}


def test_a_backlog_goes_in_batches_over_rounds(monkeypatch):
    monkeypatch.setattr(retention, "BATCH", 4)
    monkeypatch.setattr(retention, "MAX_BATCHES", 2)
    old = [finished("completed", 2 * DAY) for _ in range(11)]
    assert retention.sweep() == 8  # one round: two batches of four
    assert len(present(*old)) == 3
    assert retention.sweep() == 3
    assert present(*old) == set()


def test_a_round_that_leaves_records_due_is_followed_at_once_until_none_are(monkeypatch):
    # Given more records due than a round takes (two batches of four)
    monkeypatch.setattr(retention, "BATCH", 4)
    monkeypatch.setattr(retention, "MAX_BATCHES", 2)
    old = [finished("completed", 2 * DAY) for _ in range(11)]
    redis_client().delete(retention.ROUND_KEY)
    monkeypatch.setitem(retention._next_round, "at", 0.0)
    monkeypatch.setattr(retention, "CATCH_UP_S", 0.2)
    # When the maintenance loop asks (its turns are 0.1 s apart)
    first = retention.when_due()
    left = len(present(*old))
    at_once = retention.when_due()
    time.sleep(0.3)
    second = retention.when_due()
    # Then the round that stopped with records due is followed CATCH_UP_S later, not an
    # interval (60 s) later, and the one that found none left waits its interval again
    assert (first, left, at_once) == (8, 3, None) and second == 3 and present(*old) == set()
    time.sleep(0.3)
    assert retention.when_due() is None


def test_the_ages_follow_result_expires_unless_keel_sets_its_own(monkeypatch):
    assert retention.default_ages() == {
        State.COMPLETED: DAY,  # Celery's result_expires default
        State.FAILED: 7 * DAY,
        State.CANCELLED: 7 * DAY,
    }
    original = celery_app.conf.result_expires
    try:
        celery_app.conf.result_expires = timedelta(hours=2)
        assert retention.default_ages()[State.COMPLETED] == 7_200
        celery_app.conf.result_expires = None  # Celery: never expire
        assert retention.default_ages()[State.COMPLETED] is None
        monkeypatch.setenv("KEEL_KEEP_COMPLETED_S", "300")  # Keel's own setting wins
        monkeypatch.setenv("KEEL_KEEP_FAILED_S", "0")
        reload_settings()
        assert retention.default_ages() == {
            State.COMPLETED: 300,
            State.FAILED: None,
            State.CANCELLED: None,
        }
    finally:
        celery_app.conf.result_expires = original
        monkeypatch.undo()
        reload_settings()


def test_nothing_is_swept_when_the_ages_are_zero(monkeypatch):
    job_id = finished("failed", 400 * DAY)
    monkeypatch.setenv("KEEL_KEEP_FAILED_S", "0")
    reload_settings()
    try:
        retention.sweep()
        assert present(job_id) == {job_id}
    finally:
        monkeypatch.undo()
        reload_settings()


@pytest.mark.parametrize(
    ("state", "index"),
    [("completed", "ix_jobs_expiring_completed"), ("failed", "ix_jobs_expiring_ended")],
)
def test_the_sweep_reads_through_its_partial_index(state, index):
    """Off the hot path: the sweep never scans the table (with sequential scans disabled, the
    plan still finds its rows, so the index's predicate matches the sweep's query)."""
    rule = "removeOnComplete" if state == "completed" else "removeOnFail"
    with transaction() as session:
        session.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(
            session.scalars(
                text(
                    f"EXPLAIN SELECT id FROM jobs WHERE state = '{state}' "
                    f"AND NOT (opts ? '{rule}') "
                    "AND finished_on < clock_timestamp() - make_interval(secs => 60) "
                    "ORDER BY finished_on LIMIT 500 FOR UPDATE SKIP LOCKED"
                )
            )
        )
    assert index in plan, plan


def test_the_queues_counts_follow_the_sweep():
    finished("completed", 3 * DAY)
    retention.sweep()
    counts.compact()
    with transaction() as session:
        in_table = session.scalar(
            select(func.count())
            .select_from(JobRecord)
            .where(JobRecord.queue == "default", JobRecord.state == "completed")
        )
    assert counts.counts("default")["completed"] == in_table
