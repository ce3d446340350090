"""Messages written in one Redis pipeline (``tasks.platform.pipelined``) read as kombu's producer's
do.

A batch of Keel's messages (a bulk add, a promotion, an add's message with its events)
goes to Redis in one pipeline instead of through kombu's ``Producer.publish`` each. Real
Redis and Postgres; no worker consumes these queues.
"""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
from celery import signals
from kombu.compression import decompress
from kombu.utils import json as kombu_json
from sqlalchemy import text

from tasks.celery import app
from tasks.jobs import BulkJob, add_bulk
from tasks.jobs.intake.messages import Message, announce, publish, publish_all
from tasks.platform import broker
from tasks.platform.broker import redis_client
from tasks.platform.config import reload_settings
from tasks.platform.db import transaction
from tasks.platform.pipelined import FLUSH_AT, LPUSH_MAX, pipelined
from tasks.platform.transport import riding
from tests.support.chaos import priority_lists
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def message(queue: str, job_id: str, **extra) -> Message:
    ctx = {
        "headers": {"x-trace": "abc"},
        "group": "g-1",
        "group_index": 2,
        "chord": {"task": "test.echo", "args": [], "kwargs": {}, "options": {}},
        "timelimit": [30, 20],
    }
    return Message(
        job_id, "test.echo", queue, {"n": 1, "s": "é"}, ctx, parent=None, tenant="t-1", **extra
    )


def raw_items(queue: str) -> list[bytes]:
    """The queue's messages as Redis holds them, oldest first."""
    found: list[bytes] = []
    for name in priority_lists(queue):
        found += list(reversed(redis_client().lrange(name, 0, -1)))
    return found


def items(queue: str) -> list[dict]:
    """The queue's messages, oldest first (the order a worker takes them in)."""
    found = []
    for name in priority_lists(queue):
        found += [json.loads(item) for item in reversed(redis_client().lrange(name, 0, -1))]
    return found


def without_tag(envelope: dict) -> dict:
    """The envelope as a consumer reads it, but for its delivery tag: the body decoded
    (base64, then decompressed, then JSON when it is JSON), not as bytes."""
    envelope = json.loads(json.dumps(envelope))
    assert envelope["properties"].pop("delivery_tag")
    if "body" not in envelope:  # read already
        return envelope
    assert envelope["properties"]["body_encoding"] == "base64"
    body = base64.b64decode(envelope["body"])
    if envelope["headers"].get("compression"):
        body = decompress(body, envelope["headers"]["compression"])
    envelope["body"] = json.loads(body) if envelope["content-type"] == "application/json" else body
    return envelope


def test_a_pipelined_message_reads_as_one_the_producer_sent():
    queue = unique("pipelined")
    with app.producer_or_acquire() as producer:
        with producer.batch():
            publish(message(queue, "same-id", priority=3), producer)
        assert publish_all(producer, [message(queue, "same-id", priority=3)])
    by_producer, by_pipeline = items(queue)
    assert without_tag(by_pipeline) == without_tag(by_producer)
    assert by_pipeline["properties"]["delivery_tag"] != by_producer["properties"]["delivery_tag"]
    assert by_pipeline["properties"]["priority"] == 3
    assert by_pipeline["headers"]["keel_tenant"] == "t-1"


@pytest.fixture
def no_held_events(monkeypatch):
    """A job added alone sends its ``task-sent`` in its own pipeline (``KEEL_EVENT_FLUSH_S``
    0), not later with others (``tests/integration/test_task_events.py``)."""
    monkeypatch.setenv("KEEL_EVENT_FLUSH_S", "0")
    reload_settings()
    yield
    monkeypatch.undo()
    reload_settings()


def test_task_sent_events_in_a_pipeline_read_as_the_producers(no_held_events):
    """One job's event as ``task.sent``, several as one ``task.multi``, either way."""
    queue = unique("pipelined")
    listener = redis_client().pubsub(ignore_subscribe_messages=True)
    listener.psubscribe("*celeryev/task.*")
    listener.get_message(timeout=1)
    with app.producer_or_acquire() as producer:
        for ids in (["one"], ["a", "b"]):
            with producer.batch():
                made = [message(queue, job_id) for job_id in ids]
                for each in made:
                    each.publish(producer)
                announce(producer, [each.sent for each in made])
            assert publish_all(producer, [message(queue, job_id) for job_id in ids])
    ours = {"one", "a", "b"}  # the stack's workers send task events on the same channels
    heard = []
    deadline = time.monotonic() + 5
    while len(heard) < 4 and time.monotonic() < deadline:
        got = listener.get_message(timeout=0.5)
        if got:
            message_ = json.loads(got["data"])
            body = json.loads(base64.b64decode(message_["body"]))
            if {e.get("uuid") for e in (body if isinstance(body, list) else [body])} <= ours:
                heard.append((got["channel"], message_))
    listener.close()
    assert [channel.rsplit(b"/", 1)[-1] for channel, _ in heard] == [
        b"task.sent",
        b"task.sent",
        b"task.multi",
        b"task.multi",
    ]
    for (_, by_producer), (_, by_pipeline) in (heard[:2], heard[2:]):
        bodies = [json.loads(base64.b64decode(m.pop("body"))) for m in (by_producer, by_pipeline)]
        assert without_tag(by_pipeline) == without_tag(by_producer)
        ids = [[e["uuid"] for e in (b if isinstance(b, list) else [b])] for b in bodies]
        assert ids[0] == ids[1] and ids[0] in (["one"], ["a", "b"])
        assert {e["type"] for b in bodies for e in (b if isinstance(b, list) else [b])} == {
            "task-sent"
        }


def test_a_batch_past_one_lpush_and_one_round_trip_comes_out_in_order_once_each():
    queue = unique("pipelined")
    count = FLUSH_AT + LPUSH_MAX + 7
    ids = [f"job-{i:05d}" for i in range(count)]
    with app.producer_or_acquire() as producer:
        assert publish_all(producer, [Message(i, "test.echo", queue, {}, parent=None) for i in ids])
    assert [item["headers"]["id"] for item in items(queue)] == ids


def test_a_command_riding_along_goes_before_the_message():
    queue = unique("pipelined")
    key = priority_lists(queue)[0]  # priority 0's list
    with riding(lambda pipe: pipe.lpush(key, json.dumps({"rider": True}))) as rode:
        with app.producer_or_acquire() as producer:
            assert publish_all(producer, [Message("m-1", "test.echo", queue, {}, parent=None)])
        assert rode()  # it went: the caller does not send it again
    first, second = items(queue)
    assert first == {"rider": True} and second["headers"]["id"] == "m-1"


def test_a_rider_that_fails_does_not_fail_the_publish():
    queue, taken = unique("pipelined"), unique("taken")
    redis_client().set(taken, "not a list")
    try:
        with riding(lambda pipe: pipe.lpush(taken, "x")), app.producer_or_acquire() as producer:
            assert publish_all(producer, [Message("m-1", "test.echo", queue, {}, parent=None)])
    finally:
        redis_client().delete(taken)
    assert [item["headers"]["id"] for item in items(queue)] == ["m-1"]


def test_a_bulk_add_whose_pipeline_fails_parks_every_job_and_redis_is_not_taken_for_hung():
    queue, broken = unique("pipelined"), unique("pipelined")
    key = priority_lists(broken)[0]
    redis_client().set(key, "not a list")  # every LPUSH to that queue fails (WRONGTYPE)
    try:
        # The failing message comes last: its round trip starts after the others' were built
        # and sent, longer than a hung Redis's timeout. Redis refused at once: it is not
        # taken for hung, and stays in use (events, the next publishes).
        batch = [BulkJob("test.echo", {"i": i}, queue) for i in range(9_999)]
        added = add_bulk([*batch, BulkJob("test.echo", {"i": 9_999}, broken)])
        assert not broker.unreachable() and not broker.publish_unreachable()
        with transaction() as session:
            rows = session.execute(
                text("SELECT state, run_at IS NOT NULL FROM jobs WHERE queue IN (:q, :b)"),
                {"q": queue, "b": broken},
            ).all()
        assert redis_client().get(key) == b"not a list"
    finally:
        redis_client().delete(key)
    assert len(added) == 10_000 and all(a.created for a in added)
    # Every job of the batch is parked, those whose messages went out too (their claim
    # will find them delayed and drop the delivery); the promoter sends them again.
    assert len(rows) == 10_000 and set(rows) == {("delayed", True)}


def test_every_message_gets_its_own_delivery_tag():
    queue = unique("pipelined")
    with app.producer_or_acquire() as producer:
        assert publish_all(
            producer, [Message(str(uuid.uuid4()), "test.echo", queue, {}) for _ in range(50)]
        )
    tags = [item["properties"]["delivery_tag"] for item in items(queue)]
    assert len(tags) == 50 == len(set(tags))


@pytest.mark.parametrize(
    ("serializer", "compression"),
    [("json", "zlib"), ("pickle", None), ("pickle", "zlib")],
    ids=["json compressed", "pickle", "pickle compressed"],
)
def test_a_pipelined_message_serialized_or_compressed_reads_as_the_producers(
    serializer, compression
):
    """A Celery user's ``task_serializer`` and ``task_compression``: the body serialized
    (kombu's registry, past the pipeline's own json encoder) and compressed as kombu does."""
    queue = unique("pipelined")
    body = [[], {"text": "x" * 2000}, {}]
    with app.producer_or_acquire() as producer:
        producer.publish(
            body,
            routing_key=queue,
            serializer=serializer,
            compression=compression,
            headers={"id": "c-1"},
            delivery_mode=2,
            correlation_id="c-1",
        )
        with pipelined(producer) as batch:
            assert batch is not None
            batch.publish(
                body,
                queue,
                headers={"id": "c-1"},
                properties={"correlation_id": "c-1"},
                serializer=serializer,
                compression=compression,
            )
    by_producer, by_pipeline = items(queue)
    assert by_pipeline["content-type"] == by_producer["content-type"]
    assert by_pipeline["headers"].get("compression") == (
        "application/x-gzip" if compression else None
    )
    assert without_tag(by_pipeline) == without_tag(by_producer)


def test_what_a_publish_signal_receiver_adds_is_written_by_kombus_encoder():
    """A receiver of ``before_task_publish`` (header stamping) may add what orjson writes
    otherwise than kombu (a UUID): such a message is written by kombu's encoder, whole."""
    queue = unique("pipelined")
    stamp = uuid.UUID(int=5)

    def stamping(headers: dict, **kw: object) -> None:
        headers["x-stamp"] = stamp

    signals.before_task_publish.connect(stamping, weak=False)
    try:
        with app.producer_or_acquire() as producer:
            assert publish_all(producer, [message(queue, "stamped")])
    finally:
        signals.before_task_publish.disconnect(stamping)
    with app.producer_or_acquire() as producer:
        assert publish_all(producer, [message(queue, "plain")])  # nobody listening
    [stamped_item, plain_item] = raw_items(queue)
    assert kombu_json.loads(stamped_item)["headers"]["x-stamp"] == stamp  # a UUID again
    assert b'"__type__": "uuid"' in stamped_item
    assert b'"id":"plain"' in plain_item  # orjson's: no spaces
