"""Reconciling waiting jobs with the broker (real Postgres and Redis, no worker on the queues).

Each test uses a queue no worker consumes, so what sits in the broker stays
there until the test looks: the reconciler must republish exactly the jobs
whose message is gone, and nothing that still has one.
"""

from __future__ import annotations

import json

import pytest
from kombu import Connection
from sqlalchemy import text

from tasks.celery import app
from tasks.jobs import JobOptions, add
from tasks.jobs.upkeep.reconcile import LOCK_KEY, Busy, republish_lost
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.chaos import priority_lists
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def queued_ids(queue: str) -> list[str]:
    """The task ids of the messages waiting in ``queue`` (every priority list)."""
    client = redis_client()
    raw = [item for name in priority_lists(queue) for item in client.lrange(name, 0, -1)]
    return sorted(json.loads(item)["headers"]["id"] for item in raw)


def purge(queue: str) -> int:
    """What ``celery purge -Q queue`` does: kombu deletes the queue's messages."""
    with app.connection_for_write() as connection:
        return connection.default_channel.queue_purge(queue)


def add_echoes(queue: str, count: int) -> list[str]:
    return sorted(add("test.echo", {"i": i}, queue=queue).job_id for i in range(count))


def test_purged_jobs_get_one_message_each_and_only_once():
    # Given five waiting jobs whose messages were purged
    queue = unique("purged")
    jobs = add_echoes(queue, 5)
    assert purge(queue) == 5
    # When the reconciler runs twice
    first = republish_lost(queue, older_than_s=0)
    second = republish_lost(queue, older_than_s=0)
    # Then each job has exactly one message again, and the second round added none
    assert (first, second) == (5, 0)
    assert queued_ids(queue) == jobs


def test_a_backlog_in_the_broker_is_never_republished():
    queue = unique("backlog")
    jobs = add_echoes(queue, 5)
    assert republish_lost(queue, older_than_s=0) == 0
    assert republish_lost(older_than_s=0) >= 0  # every queue: this one still untouched
    assert queued_ids(queue) == jobs


def test_jobs_published_within_the_grace_period_are_left_alone():
    queue = unique("fresh")
    add_echoes(queue, 3)
    purge(queue)
    assert republish_lost(queue, older_than_s=60) == 0
    assert queued_ids(queue) == []


def test_a_message_reserved_with_an_unacked_copy_counts_as_present():
    # Given a job whose message a consumer that keeps kombu's unacked copy took (a previous
    # release's worker; Keel's transport keeps none of a recorded job's: test_copyless_delivery)
    queue = unique("reserved")
    [job_id] = add_echoes(queue, 1)
    with Connection(app.conf.broker_url) as connection:
        message = connection.default_channel.basic_get(queue, no_ack=False)
        assert message is not None and message.headers["id"] == job_id
        # Then the reconciler finds it in kombu's unacked hash and sends nothing
        assert republish_lost(queue, older_than_s=0) == 0
        message.ack()
    assert queued_ids(queue) == []


def test_a_chord_callback_is_left_to_celery():
    # Given a callback recorded as waiting, whose message Celery sends when its header is done,
    queue = unique("chord")
    callback = add("test.echo", {"part": "callback"}, queue=queue, publish_now=False).job_id
    body = app.signature("test.echo", kwargs={"part": "callback"}, task_id=callback, queue=queue)
    # a header job whose message names it,
    header = add("test.echo", {"part": "header"}, queue=queue, publish_now=False).job_id
    app.send_task("test.echo", kwargs={}, task_id=header, queue=queue, chord=body)
    # and a header job that waits out a retry, its chord context kept in its record
    later = add("test.echo", {}, queue=queue, opts=JobOptions(delay=60_000)).job_id
    other = add("test.echo", {"part": "other"}, queue=queue, publish_now=False).job_id
    other_body = app.signature("test.echo", task_id=other, queue=queue)
    with transaction() as session:
        session.execute(
            text("UPDATE jobs SET celery_ctx = CAST(:ctx AS jsonb) WHERE id = :id"),
            {"id": later, "ctx": json.dumps({"chord": dict(other_body), "group": "g"})},
        )
    # Then neither callback is published by the reconciler
    assert republish_lost(queue, older_than_s=0) == 0
    assert queued_ids(queue) == [header]


def test_one_round_at_a_time():
    lock = redis_client().lock(LOCK_KEY, timeout=10)
    assert lock.acquire(blocking=False)
    try:
        with pytest.raises(Busy):
            republish_lost(older_than_s=0, wait_s=0)
    finally:
        lock.release()


def test_keel_jobs_republish_runs_one_round():
    from click.testing import CliRunner

    from keel.cli import main

    queue = unique("cli")
    jobs = add_echoes(queue, 3)
    assert purge(queue) == 3
    result = CliRunner().invoke(
        main, ["jobs", "republish", "--queue", queue, "--older-than", "0"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "republished 3 job(s)" in result.output
    assert queued_ids(queue) == jobs
