"""Cancelled jobs stay cancelled: never promoted, published, claimed or run.

The fast tier: the records in the module's Postgres, messages in the
session's Redis, and a Celery worker in this process (``inline_worker``),
whose maintenance loop promotes delayed jobs and reads its revoked set.
"""

from __future__ import annotations

import json
import threading

import pytest
from celery.worker import state as worker_state
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from keel.embedded import free_port
from tasks.jobs import JobOptions, add
from tasks.jobs.end import revocations
from tasks.jobs.end.cancel import cancel
from tasks.jobs.store import runs
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.chaos import priority_lists
from tests.support.client import record, unique, wait_state
from tests.support.databases import using
from tests.support.inline import join
from tests.support.stack import wait_for

pytestmark = pytest.mark.usefixtures("inline_worker")


def queued_ids(queue: str) -> list[str]:
    """The job ids of the messages waiting in ``queue``'s Redis lists."""
    client = redis_client()
    raw = [m for name in priority_lists(queue) for m in client.lrange(name, 0, -1)]
    return [json.loads(message)["headers"]["id"] for message in raw]


def test_a_cancelled_delayed_job_is_never_published():
    # Given two jobs due in 0.3 s on a queue no worker consumes
    queue = unique("quiet")
    cancelled, control = (
        add("test.echo", {}, queue=queue, opts=JobOptions(delay=300)).job_id for _ in range(2)
    )
    # When one is cancelled before it is due
    assert cancel(cancelled, None).job.state == "cancelled"
    # Then the promoter publishes the other one when due, and never the cancelled one
    wait_state(control, "waiting", timeout=10)
    assert queued_ids(queue) == [control]
    assert record(cancelled)["state"] == "cancelled"


def test_a_cancelled_waiting_job_is_never_claimed():
    # Given a waiting job whose message is in the broker, then cancelled
    queue = unique("quiet")
    job = add("test.echo", {}, queue=queue).job_id
    assert queued_ids(queue) == [job]
    cancel(job, None)
    # When its message is delivered, the claim does not take it
    with transaction() as session:
        assert runs.claim(session, job, "token", 30, "tester") is None
    assert record(job)["state"] == "cancelled"


def test_a_job_a_promoter_is_publishing_is_cancelled_once_that_commits():
    # Given a delayed job that a promoter has locked and made waiting, not yet committed
    queue = unique("quiet")
    job = add("test.echo", {}, queue=queue, opts=JobOptions(delay=86_400_000)).job_id
    outcome: list[object] = []
    with transaction() as promoter:
        promoter.execute(text("UPDATE jobs SET state = 'waiting' WHERE id = :id"), {"id": job})

        def cancel_now() -> None:
            try:
                outcome.append(cancel(job, None).job.state)
            except Exception as exc:  # reported below
                outcome.append(exc)

        # When a cancel arrives meanwhile
        canceller = threading.Thread(target=cancel_now)
        canceller.start()
        canceller.join(timeout=1)
        assert canceller.is_alive()  # it waits on the promoter's row lock
    # Then, once the promoter commits, it cancels the job as committed (waiting)
    canceller.join(timeout=10)
    assert outcome == ["cancelled"]
    with transaction() as session:
        assert runs.claim(session, job, "token", 30, "tester") is None


def test_ids_in_the_workers_revoked_set_are_cancelled_by_its_maintenance_loop():
    # Given a delayed job, a waiting job (on a queue nobody consumes) and a finished job
    queue = unique("quiet")
    delayed = add("test.echo", {}, queue=queue, opts=JobOptions(delay=86_400_000)).job_id
    waiting = add("test.echo", {}, queue=queue).job_id
    finished = add("test.echo", {}, queue="default").job_id
    join([finished])
    # When the worker learns they are revoked (what a revoke broadcast does)
    for job in (delayed, waiting, finished):
        worker_state.revoked.add(job)
    # Then within a few ticks the two that had not run are cancelled, the finished one stays
    wait_for(lambda: record(delayed)["state"] == record(waiting)["state"] == "cancelled", 10)
    assert record(finished)["state"] == "completed"


def test_a_discarded_message_whose_record_was_unreachable_is_cancelled_later():
    # Given a waiting job whose revoked message a worker discards while Postgres is unreachable
    job = add("test.echo", {}, queue=unique("quiet")).job_id
    unreachable = f"postgresql://postgres:@127.0.0.1:{free_port()}/none"
    with using(unreachable), pytest.raises(OperationalError):
        revocations.revoked_message(job, terminated=False)
    # When the records are back, then the worker's maintenance loop cancels it
    wait_for(lambda: record(job)["state"] == "cancelled", 10)
