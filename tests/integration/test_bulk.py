"""Bulk add (BullMQ's ``addBulk``) against the real Postgres and Redis, run by a real worker."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from tasks.jobs import BulkJob, Deduplication, JobOptions, Owner, add_bulk
from tasks.jobs.model.errors import QuotaExceeded
from tasks.jobs.model.models import JobRecord
from tasks.platform.db import transaction
from tasks.platform.setting_types import TenantLimits
from tests.support.client import record, unique
from tests.support.inline import join

pytestmark = pytest.mark.usefixtures("inline_worker")


def owned_by(tenant: str) -> int:
    with transaction() as session:
        query = select(func.count()).select_from(JobRecord).where(JobRecord.tenant_id == tenant)
        return session.execute(query).scalar_one()


def test_a_bulk_add_records_every_job_and_each_runs_once():
    label = unique("bulk")
    jobs = [BulkJob("test.echo", {"label": label, "i": i}, "default") for i in range(300)]
    added = add_bulk(jobs)
    assert len(added) == 300 and all(a.created and a.state == "waiting" for a in added)
    done = join([a.job_id for a in added], timeout=120)
    assert all(job["state"] == "completed" for job in done.values())
    assert all(job["attemptsStarted"] == 1 for job in done.values())
    assert sorted(job["result"]["echo"]["i"] for job in done.values()) == list(range(300))


def test_delayed_deduplicated_and_existing_jobs_in_a_bulk_add():
    key = unique("dedup")
    existing = unique("id")
    first = add_bulk(
        [BulkJob("test.echo", {}, "default", JobOptions(job_id=existing, delay=60_000))]
    )
    added = add_bulk(
        [
            BulkJob("test.echo", {"n": 1}, "default", JobOptions(delay=60_000)),
            # Delayed, so the first is still live when the second is added: a simple-mode
            # claim lasts until its job ends, and a waiting echo job can end at once.
            BulkJob(
                "test.echo",
                {"n": 2},
                "default",
                JobOptions(delay=60_000, deduplication=Deduplication(id=key)),
            ),
            BulkJob(
                "test.echo",
                {"n": 3},
                "default",
                JobOptions(delay=60_000, deduplication=Deduplication(id=key)),
            ),
            BulkJob("test.echo", {"n": 4}, "default", JobOptions(job_id=existing)),
        ]
    )
    assert first[0].created
    assert record(added[0].job_id)["state"] == "delayed"
    assert added[1].created and not added[2].created and added[2].job_id == added[1].job_id
    assert (added[3].job_id, added[3].created, added[3].state) == (existing, False, "existing")


def test_a_bulk_add_past_the_tenant_quota_adds_nothing():
    tenant = unique("t")
    limits = TenantLimits(live_jobs=5, max_delay_ms=60_000)
    jobs = [BulkJob("test.echo", {"i": i}, "default", JobOptions(delay=30_000)) for i in range(6)]
    with pytest.raises(QuotaExceeded):
        add_bulk(jobs, owner=Owner(tenant, "alice"), limits=limits)
    assert owned_by(tenant) == 0
    add_bulk(jobs[:5], owner=Owner(tenant, "alice"), limits=limits)
    assert owned_by(tenant) == 5


class Statements:
    """The INSERTs into ``jobs`` naming ``label`` that this process sends while counting
    (the inline worker's threads send statements of their own meanwhile)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.inserts = 0

    def __call__(self, conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO JOBS"):
            self.inserts += self.label in str(parameters)


def test_calls_recorded_together_are_one_insert_and_each_runs_once():
    from sqlalchemy import event

    from tasks.jobs import recorded_together
    from tasks.platform.db import engine
    from tests.support.jobs import celery_part

    label = unique("together")
    counted = Statements(label)
    event.listen(engine(), "before_cursor_execute", counted)
    try:
        with recorded_together():
            results = [celery_part.delay(i, label) for i in range(40)]
            # Inside the block the calls have their ids, and nothing is recorded yet
            assert all(record(r.id) is None for r in results)
    finally:
        event.remove(engine(), "before_cursor_execute", counted)
    assert counted.inserts == 1
    done = join([r.id for r in results], timeout=120)
    assert all(job["state"] == "completed" for job in done.values())
    assert all(job["attemptsStarted"] == 1 for job in done.values())
    assert sorted(job["result"]["index"] for job in done.values()) == list(range(40))


def test_a_block_that_raises_records_none_of_its_calls():
    from tasks.jobs import recorded_together
    from tests.support.jobs import celery_part

    label = unique("raises")
    ids: list[str] = []
    with pytest.raises(RuntimeError), recorded_together():
        ids.extend(celery_part.delay(i, label).id for i in range(3))
        raise RuntimeError("the caller changed its mind")
    assert len(ids) == 3 and all(record(job_id) is None for job_id in ids)


def test_a_chord_recorded_together_fans_in_once_and_an_existing_part_is_not_added_twice():
    from celery import chord

    from tasks.jobs import recorded_together
    from tests.support.jobs import celery_collect, celery_part

    label = unique("chord")
    existing = celery_part.apply_async((0, label), task_id=f"{label}-0").id
    join([existing])
    parts = [celery_part.si(i, label).set(task_id=f"{label}-{i}") for i in range(1, 8)]
    again = celery_part.si(0, label).set(task_id=existing)
    with recorded_together():
        result = chord([again, *parts])(celery_collect.s())
    body = join([result.id], timeout=120)[result.id]
    assert body["state"] == "completed", body
    assert [r["index"] for r in body["result"]["results"]] == list(range(8))
    assert record(existing)["attemptsStarted"] == 1  # not run again for the chord


def test_a_chord_in_a_block_that_raises_leaves_no_parts_and_its_body_cancelled():
    from celery import chord

    from tasks.jobs import recorded_together
    from tests.support.jobs import celery_collect, celery_part

    label = unique("chord-raises")
    parts = [celery_part.si(i, label).set(task_id=f"{label}-{i}") for i in range(3)]
    with pytest.raises(RuntimeError), recorded_together():
        result = chord(parts)(celery_collect.s())
        raise RuntimeError("the caller changed its mind")
    assert all(record(f"{label}-{i}") is None for i in range(3))
    # Celery recorded the body when the chord was sent: it is cancelled, not left waiting
    assert record(result.id)["state"] == "cancelled"


def test_a_nested_block_that_raises_drops_only_its_own_calls():
    from tasks.jobs import recorded_together
    from tests.support.jobs import celery_part

    label = unique("nested")
    with recorded_together():
        kept = celery_part.delay(0, label).id
        try:
            with recorded_together():
                dropped = celery_part.delay(1, label).id
                raise RuntimeError("the inner step failed")
        except RuntimeError:
            pass
        also_kept = celery_part.delay(2, label).id
    done = join([kept, also_kept])
    assert all(job["state"] == "completed" for job in done.values())
    assert record(dropped) is None


def test_a_job_id_called_twice_in_a_block_is_one_job_and_its_chord_counts_it():
    from celery import chord

    from tasks.jobs import recorded_together
    from tests.support.jobs import celery_collect, celery_part

    label = unique("twice")
    with recorded_together():
        first = celery_part.apply_async((0, label), task_id=f"{label}-0").id
        parts = [celery_part.si(i, label).set(task_id=f"{label}-{i}") for i in range(3)]
        result = chord(parts)(celery_collect.s())  # its part 0 names the job just called
    body = join([result.id], timeout=120)[result.id]
    assert body["state"] == "completed", body
    assert [r["index"] for r in body["result"]["results"]] == [0, 1, 2]
    assert record(first)["attemptsStarted"] == 1


def test_a_tenants_calls_recorded_together_past_its_quota_add_nothing(monkeypatch):
    import json

    from celery import group

    from tasks.jobs import acting_as, recorded_together
    from tasks.platform.config import reload_settings
    from tests.support.jobs import celery_part

    monkeypatch.setenv("KEEL_TENANT_QUOTAS", json.dumps({"liveJobs": 5}))
    reload_settings()
    try:
        tenant, label = unique("t"), unique("quota")
        # A group of six delayed calls for a tenant allowed five live jobs: refused whole
        six = group(celery_part.si(i, label).set(countdown=60) for i in range(6))
        with pytest.raises(QuotaExceeded), acting_as(Owner(tenant, "alice")), recorded_together():
            six.apply_async()
        assert owned_by(tenant) == 0
        five = group(celery_part.si(i, label).set(countdown=60) for i in range(5))
        with acting_as(Owner(tenant, "alice")), recorded_together():
            five.apply_async()
        assert owned_by(tenant) == 5
    finally:
        monkeypatch.undo()  # the quotas as they were, before the settings are read again
        reload_settings()
