"""Poison messages on RabbitMQ: the worker lives, the message leaves the queue, Keel keeps it.

RabbitMQ delivers any body with any properties. What Celery cannot take —
a body that is not what its content type says, a content type the worker
does not accept, a message that is no task message — is set aside in the
queue's dead letters in Keel's Redis (``keel deadletters list``, a
``dead-lettered`` event), and acknowledged or rejected without requeueing:
it neither kills the worker nor comes back forever.
"""

from __future__ import annotations

import json

from kombu import Connection, Exchange, Producer, Queue

from tasks.jobs import add
from tasks.jobs.observe import events
from tasks.platform import deadletters
from tasks.platform.broker import redis_client
from tests.rabbitmq.conftest import amqp_url
from tests.support.client import unique, wait_state
from tests.support.rabbitmq import queue_depth
from tests.support.stack import wait_for

QUORUM = {"x-queue-type": "quorum"}


def publish_raw(url: str, queue: str, body: bytes, content_type: str, headers: dict) -> None:
    """Put one message on ``queue`` as any AMQP client could, bypassing Celery."""
    exchange = Exchange(queue, type="topic")  # as Keel declares it (tasks.celeryconfig)
    with Connection(url) as conn:
        Producer(conn).publish(
            body,
            exchange=exchange,
            routing_key=queue,
            content_type=content_type,
            content_encoding="binary" if content_type.endswith("pickle") else "utf-8",
            headers=headers,
            declare=[Queue(queue, exchange, routing_key=queue, queue_arguments=QUORUM)],
        )


def test_poison_messages_are_dead_lettered_and_the_worker_goes_on(spawn, on_rabbitmq):
    url = amqp_url(on_rabbitmq)
    queue = unique("rabbit-poison")
    # Given a worker on a queue that received three messages Celery cannot take
    poison = {
        "not JSON": (b"\xff\xfe{not json", "application/json", {"task": "test.echo", "id": "p1"}),
        "refused content": (b"\x80\x04junk", "application/x-pickle", {"task": "test.echo"}),
        "no task message": (json.dumps({"hello": "world"}).encode(), "application/json", {}),
    }
    for body, content_type, headers in poison.values():
        publish_raw(url, queue, body, content_type, headers)
    worker = spawn("poison", concurrency=1, queues=queue)
    # When a job is added behind them
    job = add("test.echo", {"after": "poison"}, queue=queue)
    # Then the job completes and the worker is still alive
    assert wait_state(job.job_id, "completed", timeout=60)
    assert worker.process.poll() is None, worker.log_tail()
    # And each poison message is kept in the queue's dead letters, with why
    letters = wait_for(
        lambda: (found := deadletters.entries(redis_client(), queue)) and len(found) >= 3 and found,
        timeout=20,
    )
    kept = [json.loads(letter.raw) for _, letter in letters]
    assert sorted(d["content-type"] for d in kept) == sorted(p[1] for p in poison.values())
    assert all(letter.reason for _, letter in letters)
    dead = [e for e in events.read([queue], since="0") if e["event"] == "dead-lettered"]
    assert len(dead) == 3
    # And none of them is left in, or came back to, the queue
    assert queue_depth(url, queue) == 0
    assert len(deadletters.entries(redis_client(), queue)) == 3
