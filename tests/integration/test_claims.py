"""The claim against a job whose promotion has not committed yet (real Postgres).

A promoter publishes inside its transaction (``tasks.jobs.intake.promote``), so a
worker may try to claim a job whose row is still locked by that transaction
and still *delayed* in the claim's snapshot. The claim must wait for the
commit and then take the job — not skip it as "not waiting" and strand it.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from tasks.jobs import JobOptions, add
from tasks.jobs.store import jobs as store
from tasks.jobs.store import runs, upkeep
from tasks.jobs.store.jobs import NewJob
from tasks.platform.db import transaction
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def test_a_claim_waits_for_the_promotion_and_takes_the_job():
    # Given a delayed job (its queue has no worker: nothing else touches it)
    job_id = add("test.echo", {}, queue=unique("claims"), opts=JobOptions(delay=60_000)).job_id
    claimed: dict = {}

    def claim() -> None:
        with transaction() as session:
            claimed["job"] = runs.claim(session, job_id, "token-1", 30, "tester")

    # When a promoter moves it to waiting and, before committing, a delivery claims it
    with transaction() as promoting:
        promoting.execute(text("UPDATE jobs SET state = 'waiting' WHERE id = :id"), {"id": job_id})
        worker = threading.Thread(target=claim)
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive()  # the claim waits on the row lock
    worker.join(timeout=10)
    # Then, once the promotion committed, the claim took the job
    job = claimed["job"]
    assert job is not None and job.id == job_id and job.attempts_started == 1
    assert job.stalled is False


def test_a_second_claim_of_an_active_job_with_a_live_lock_is_refused():
    job_id = add("test.echo", {}, queue=unique("claims"), opts=JobOptions(delay=60_000)).job_id
    with transaction() as session:
        session.execute(text("UPDATE jobs SET state = 'waiting' WHERE id = :id"), {"id": job_id})
    with transaction() as session:
        first = runs.claim(session, job_id, "token-1", 30, "tester")
    with transaction() as session:
        second = runs.claim(session, job_id, "token-2", 30, "tester")
    assert first is not None and second is None


def test_a_limit_parks_a_job_whose_promotion_has_not_committed_yet():
    """A delivery held by a queue limit parks its job again; it must wait for the promotion
    too, or the job would stay waiting with its message already consumed."""
    job_id = add("test.echo", {}, queue=unique("claims"), opts=JobOptions(delay=60_000)).job_id

    def park() -> None:
        with transaction() as session:
            upkeep.park(session, [job_id], 5.0)

    with transaction() as promoting:
        promoting.execute(text("UPDATE jobs SET state = 'waiting' WHERE id = :id"), {"id": job_id})
        holder = threading.Thread(target=park)
        holder.start()
        time.sleep(0.3)
        assert holder.is_alive()
    holder.join(timeout=10)
    with transaction() as session:
        assert store.get(session, job_id).state == "delayed"


def test_a_claim_of_a_job_whose_insert_has_not_committed_waits_for_it_and_takes_it():
    """A canvas child is recorded and published inside its parent's completing transaction
    (``tasks.jobs.end.canvas``): its delivery can arrive before that commit. The claim alone
    cannot see an uncommitted insert; ``await_insert`` waits for the inserting transaction,
    and the claim after it takes the job."""
    job = NewJob(
        id=unique("child"),
        name="test.echo",
        queue=unique("claims"),
        data={},
        tenant_id=None,
        user_id=None,
        opts=JobOptions(),
        priority=0,
    )
    waited: dict = {}

    def deliver() -> None:
        waited["found"] = runs.await_insert(job.id)
        waited["job"] = runs.claim_alone(job.id, "token-1", 30, "tester")

    # Given a transaction that recorded the job and has not committed
    with transaction() as inserting:
        assert store.insert(inserting, job)
        # When a delivery claims it meanwhile
        assert runs.claim_alone(job.id, "token-1", 30, "tester") is None  # invisible yet
        worker = threading.Thread(target=deliver)
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive()  # it waits for the inserting transaction
    worker.join(timeout=10)
    # Then, once the insert committed, the delivery found the record and took the job
    assert waited["found"] is True
    claimed = waited["job"]
    assert claimed is not None and claimed.id == job.id and claimed.attempts_started == 1


def test_waiting_for_an_insert_that_never_happened_records_nothing():
    job_id = unique("never")
    assert runs.await_insert(job_id) is False
    with transaction() as session:
        assert store.get(session, job_id) is None
