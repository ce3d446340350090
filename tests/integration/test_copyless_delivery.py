"""A recorded job's message leaves no unacked copy in Redis (``tasks.platform.transport.QoS``).

A consumer on Keel's Redis transport holds a recorded job's message in memory only: its
prefetch slot until the ack, a requeue or a warm shutdown putting it back from there. A
consumer that dies holding it leaves the record waiting, and the reconciler publishes it
again. A message sent without Keel keeps kombu's unacked copy. Real Redis and Postgres; no
worker consumes these queues.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kombu import Producer
from sqlalchemy import text

from tasks.celery import app
from tasks.jobs import add
from tasks.jobs.upkeep.reconcile import republish_lost
from tasks.platform.broker import redis_client
from tasks.platform.db import engine
from tests.support.chaos import priority_lists
from tests.support.client import unique
from tests.support.jobs import rate_limited

pytestmark = pytest.mark.usefixtures("stack")
UNACKED = "unacked"


def queued(queue: str) -> list[dict]:
    lists = [redis_client().lrange(name, 0, -1) for name in priority_lists(queue)]
    return [json.loads(item) for items in lists for item in items]


def keel_job(queue: str) -> str:
    return add("test.echo", {"n": 1}, queue=queue).job_id


def foreign_message(queue: str) -> str:
    """A task message sent without Keel (another app's ``send_task``): no ``keel`` header."""
    task_id = str(uuid.uuid4())
    with app.connection_for_write() as connection:
        Producer(connection.default_channel).publish(
            [[], {"n": 1}, {}],
            routing_key=queue,
            headers={"id": task_id, "task": "test.echo", "lang": "py"},
            serializer="json",
        )
    return task_id


@contextmanager
def taken_by_a_dying_consumer(queue: str, job_id: str) -> Iterator[None]:
    """In the block, ``job_id``'s message is held by a consumer on Keel's transport that then
    dies: its slot is dropped, nothing restored, as a killed worker leaves it."""
    connection = app.connection_for_read()
    message = connection.default_channel.basic_get(queue, no_ack=False)
    assert message is not None and message.headers["id"] == job_id
    try:
        yield
    finally:
        connection.default_channel.qos._delivered.clear()  # not restored: it died
        connection.release()


def copies() -> dict[str, str]:
    """kombu's unacked copies by delivery tag: the task id each carries."""
    found = {}
    for tag, raw in redis_client().hgetall(UNACKED).items():
        payload = json.loads(raw)[0]
        found[tag.decode()] = payload["headers"]["id"]
    return found


def test_a_recorded_jobs_message_is_held_in_memory_only_and_a_requeue_puts_it_back():
    queue = unique("copyless")
    job_id = keel_job(queue)
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None and message.headers["id"] == job_id
        # Then no copy of it is in Redis, and its prefetch slot is held
        assert job_id not in copies().values()
        assert queued(queue) == []
        assert message.delivery_tag in channel.qos._delivered
        assert copies() == {} or message.delivery_tag not in copies()
        # When it is requeued (a rejected delivery, a lost pool process)
        message.reject(requeue=True)
    # Then it is back on its queue, once, marked redelivered, and still has no copy
    [back] = queued(queue)
    assert back["headers"]["id"] == job_id and back["headers"]["redelivered"] is True
    assert job_id not in copies().values()


def test_a_consumer_gone_with_a_recorded_jobs_message_leaves_it_to_the_reconciler():
    queue = unique("copyless-gone")
    job_id = keel_job(queue)
    # Given a consumer that took the message and was never heard of again (killed)
    with taken_by_a_dying_consumer(queue, job_id):
        # Then Redis has no trace of it, and its record is still waiting: the reconciler
        # publishes it again (a later delivery runs only if it claims the record)
        assert queued(queue) == [] and job_id not in copies().values()
        assert republish_lost(queue, older_than_s=0) == 1
        assert [m["headers"]["id"] for m in queued(queue)] == [job_id]


def test_a_message_sent_without_keel_keeps_its_unacked_copy():
    queue = unique("foreign")
    task_id = foreign_message(queue)
    with app.connection_for_read() as connection:
        message = connection.default_channel.basic_get(queue, no_ack=False)
        assert message is not None and message.headers["id"] == task_id
        assert copies().get(message.delivery_tag) == task_id
        message.ack()
    assert task_id not in copies().values()


def test_a_task_with_celerys_rate_limit_keeps_its_unacked_copy():
    # Its messages wait in the worker's memory for a token, where the reconciler cannot see
    # them: the copy keeps the reconciler from publishing them again meanwhile
    queue = unique("rate-limited")
    job_id = rate_limited.apply_async(queue=queue).id
    with app.connection_for_read() as connection:
        message = connection.default_channel.basic_get(queue, no_ack=False)
        assert message is not None and message.headers["id"] == job_id
        assert message.headers.get("keel")
        assert copies().get(message.delivery_tag) == job_id
        assert republish_lost(queue, older_than_s=0) == 0
        message.ack()


def test_a_warm_shutdown_puts_back_what_was_not_acknowledged_once_each():
    queue = unique("restore")
    kept, acked = keel_job(queue), keel_job(queue)
    foreign = foreign_message(queue)
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        taken = [channel.basic_get(queue, no_ack=False) for _ in range(3)]
        assert sorted(m.headers["id"] for m in taken) == sorted([kept, acked, foreign])
        done = next(m for m in taken if m.headers["id"] == acked)
        done.ack()
        channel.qos.restore_by_tag(done.delivery_tag)  # acknowledged: nothing to put back
        assert queued(queue) == []
        # When the consumer stops (kombu restores its unacknowledged messages)
        channel.qos.restore_unacked_once()
    # Then the two it had not acknowledged are back, once each; the acknowledged one is not
    assert sorted(m["headers"]["id"] for m in queued(queue)) == sorted([kept, foreign])
    assert not {kept, acked, foreign} & set(copies().values())


def canvas_of(message: dict) -> dict:
    """The embedded canvas (Celery's protocol 2 body: args, kwargs, embed) of a queued item."""
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return json.loads(body)[2]


def test_a_waiting_job_sent_through_a_canvas_keeps_its_canvas_when_its_message_is_lost():
    # Given a job recorded without a message, then sent with a link (a canvas over
    # recorded jobs: its wake-up message carries the link)
    queue = unique("canvas")
    job_id = add("test.echo", {"n": 1}, queue=queue, publish_now=False).job_id
    follow_up = app.signature("test.echo", kwargs={"n": 2}, queue=queue)
    app.signature("test.echo", kwargs={"n": 1}, task_id=job_id, queue=queue).apply_async(
        link=follow_up
    )
    [woken] = queued(queue)
    assert canvas_of(woken)["callbacks"][0]["task"] == "test.echo"
    # When a worker takes that message and dies before it claims the job
    with taken_by_a_dying_consumer(queue, job_id):
        # Then the message the reconciler publishes from the record still carries the link
        assert republish_lost(queue, older_than_s=0) == 1
        [again] = queued(queue)
        assert again["headers"]["id"] == job_id
        assert canvas_of(again)["callbacks"] == canvas_of(woken)["callbacks"]


def test_a_worker_that_prefetches_more_keeps_copies():
    # Messages prefetched behind busy processes wait in memory, unseen by the reconciler
    queue = unique("prefetch")
    job_id = keel_job(queue)
    before = app.conf.worker_prefetch_multiplier
    app.conf.worker_prefetch_multiplier = 4
    try:
        with app.connection_for_read() as connection:
            message = connection.default_channel.basic_get(queue, no_ack=False)
            assert message is not None and message.headers["id"] == job_id
            assert copies().get(message.delivery_tag) == job_id
            message.ack()
    finally:
        app.conf.worker_prefetch_multiplier = before
    assert job_id not in copies().values()


def test_waking_a_job_whose_row_another_transaction_holds_does_not_wait_for_it():
    # Given a waiting job whose row another transaction holds (a caller's open transaction)
    queue = unique("held-row")
    job_id = add("test.echo", {"n": 1}, queue=queue, publish_now=False).job_id
    follow_up = app.signature("test.echo", kwargs={"n": 2}, queue=queue)
    with engine().connect() as holder:
        holder.execute(text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": job_id})
        # When it is sent through a canvas meanwhile
        call = threading.Thread(
            target=lambda: app.signature(
                "test.echo", kwargs={"n": 1}, task_id=job_id, queue=queue
            ).apply_async(link=follow_up),
            daemon=True,
        )
        call.start()
        call.join(timeout=10)
        # Then the call returns without waiting for that transaction, its message sent
        assert not call.is_alive()
        [woken] = queued(queue)
        assert canvas_of(woken)["callbacks"][0]["task"] == "test.echo"
        holder.rollback()
