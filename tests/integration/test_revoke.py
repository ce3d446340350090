"""Celery's ``revoke`` against a real ``celery worker`` process: the record becomes cancelled.

A delayed job has no message for Celery to discard, so the worker's
maintenance loop cancels it from the worker's revoked set; a waiting job's
message is discarded by the worker when it arrives (``task_revoked``).
Either way the job never runs.
"""

from __future__ import annotations

import pytest

from tasks.celery import app
from tasks.jobs import JobOptions, add
from tasks.platform.broker import redis_client
from tests.support.chaos import priority_lists
from tests.support.client import record, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.stack
# Revoke is a broadcast: generous for its delivery and the next maintenance tick.
CANCELLED_WITHIN_S = 10


@pytest.fixture
def queue(stack):
    """A queue of its own, consumed by one worker process (one job at a time)."""
    name = unique("revoke")
    worker = WorkerProcess(stack.home, name, concurrency=1, queues=name)
    worker.start()
    yield name
    worker.stop()


def test_a_revoked_delayed_job_is_cancelled_before_it_is_due_and_never_runs(queue):
    # Given two jobs delayed on the worker's queue, due after the cancel window
    opts = JobOptions(delay=(CANCELLED_WITHIN_S + 2) * 1000)
    revoked, control = (add("test.echo", {}, queue=queue, opts=opts).job_id for _ in range(2))
    # When one is revoked the Celery way
    app.control.revoke(revoked)
    # Then its record is cancelled within seconds, while the other is still delayed
    assert wait_state(revoked, "cancelled", timeout=CANCELLED_WITHIN_S)["processedOn"] is None
    assert record(control)["state"] == "delayed"
    # And after the other came due and ran, the revoked one has still never run
    wait_state(control, "completed", timeout=30)
    after = record(revoked)
    assert after is not None and (after["state"], after["attemptsStarted"]) == ("cancelled", 0)


def test_a_revoked_waiting_job_is_cancelled_and_its_message_discarded(queue, tmp_path):
    # Given the worker busy with a job it holds, and a job waiting behind it in the broker
    release = tmp_path / "release"
    holder = add("test.hold", {"until": str(release), "maxMs": 60_000}, queue=queue).job_id
    wait_state(holder, "active", timeout=30)
    waiting = add("test.echo", {}, queue=queue).job_id
    assert record(waiting)["state"] == "waiting"
    # When the waiting job is revoked, then the worker is free again
    app.control.revoke(waiting)
    wait_state(waiting, "cancelled", timeout=CANCELLED_WITHIN_S)
    release.touch()
    wait_state(holder, "completed", timeout=30)
    # Then the worker takes the revoked job's message off the queue without running it
    wait_for(lambda: sum(redis_client().llen(n) for n in priority_lists(queue)) == 0, 15)
    after = record(waiting)
    assert after is not None and (after["state"], after["attemptsStarted"]) == ("cancelled", 0)


def test_a_message_revoked_before_its_job_was_added_is_discarded_and_the_job_cancelled(queue):
    # Given an id revoked before any job has it (the revoked-set check finds no record)
    job_id = unique("early")
    app.control.revoke(job_id)
    wait_for(lambda: job_id in inspected_revoked(), CANCELLED_WITHIN_S)
    # When a job with that id is added, and its message reaches the worker
    add("test.echo", {}, queue=queue, opts=JobOptions(jobId=job_id))
    # Then the worker discards the message and task_revoked cancels the record
    after = wait_state(job_id, "cancelled", "completed", timeout=CANCELLED_WITHIN_S)
    assert (after["state"], after["attemptsStarted"]) == ("cancelled", 0)


def inspected_revoked() -> set[str]:
    """The ids every running worker holds as revoked (Celery's ``inspect revoked``).

    On a connection of its own, not one from the app's pool: a connection pooled before
    another test restarted Redis is closed by then, and kombu's reading of the replies
    does not reconnect it (the first ``inspect()`` after a restart raises
    ``ConnectionError: Connection closed by server``; the next one works).
    """
    with app.connection_for_write() as connection:
        replies = app.control.inspect(timeout=1, connection=connection).revoked() or {}
    return {job_id for ids in replies.values() for job_id in ids}


def test_a_running_job_revoked_with_terminate_is_cancelled_and_its_run_ends(queue):
    # Given a job running on the worker for a long while
    running = add("test.sleep", {"ms": 60_000}, queue=queue).job_id
    wait_state(running, "active", timeout=30)
    # When it is revoked with terminate=True (Celery kills the process running it)
    app.control.revoke(running, terminate=True)
    # Then its record is cancelled, and the worker goes on with the next job
    assert wait_state(running, "cancelled", timeout=CANCELLED_WITHIN_S)["attemptsStarted"] == 1
    after = add("test.echo", {}, queue=queue).job_id
    wait_state(after, "completed", timeout=30)
    assert record(running)["state"] == "cancelled"
