"""A batch of events (a bulk add's, a promotion's) goes to Redis as one script call.

``tasks.jobs.observe.events`` sends a batch of ``MANY`` events or more through a script
instead of one XADD each: the stream entries, the news on an ending job's result channel
and the counts must be what sending them one by one gives. Real Redis.
"""

from __future__ import annotations

import json
import time

import pytest

from tasks.jobs.observe import events, metrics
from tasks.platform.broker import redis_client
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def entries(queue: str) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in ("id", "time")} for e in events.read([queue])]


def counters(queue: str) -> dict[str, int]:
    assert metrics.flush()
    raw = redis_client().hgetall(metrics.events_key(queue))
    return {field.decode(): int(value) for field, value in raw.items()}


def batch(queue: str, size: int) -> list[events.Event]:
    made = []
    for i in range(size):
        kind = ("waiting", "active", "completed", "failed")[i % 4]
        extra = {"returnvalue": {"i": i}} if kind == "completed" else {}
        made.append(events.Event(queue, kind, f"job-{i}", "test.echo", **extra))
    return made


def test_a_big_batch_writes_what_one_by_one_writes_in_the_same_order():
    one_by_one, scripted, other = unique("events"), unique("events"), unique("events")
    for event in batch(one_by_one, events.MANY + 5):
        events._send([event])  # a pipeline of one XADD
    # The same events as one batch (past MANY: the script), with another queue's among them
    mixed = batch(scripted, 10) + batch(other, 3) + batch(scripted, events.MANY + 5)[10:]
    events._send(mixed)
    assert len(entries(scripted)) == events.MANY + 5
    assert entries(scripted) == [{**e, "queue": scripted} for e in entries(one_by_one)]
    assert [e["jobId"] for e in entries(other)] == ["job-0", "job-1", "job-2"]
    assert all(e["time"] for e in events.read([scripted]))


def test_an_ending_event_in_a_big_batch_tells_its_result_channel_once():
    queue = unique("events")
    made = batch(queue, events.MANY * 2)
    for event in made:
        event.job_id = f"{queue}-{event.job_id}"  # channels no other test listens on
        event.entry["jobId"] = event.job_id
    ending, running = made[2], made[1]  # completed, active
    listener = redis_client().pubsub(ignore_subscribe_messages=True)
    listener.subscribe(events.result_channel(ending.job_id), events.result_channel(running.job_id))
    listener.get_message(timeout=1)
    events._send(made)
    heard = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(heard) < 1:
        got = listener.get_message(timeout=0.2)
        if got:
            heard.append((got["channel"].decode(), json.loads(got["data"])))
    while got := listener.get_message(timeout=0.3):  # and nothing after it
        heard.append((got["channel"].decode(), json.loads(got["data"])))
    listener.close()
    assert heard == [
        (events.result_channel(ending.job_id), {"task_id": ending.job_id, "status": events.ENDED})
    ]


def test_a_failing_command_in_a_big_batch_costs_only_its_own_event():
    queue, broken = unique("events"), unique("events")
    redis_client().set(events.stream_key(broken), "not a stream")
    try:
        made = batch(queue, 10) + batch(broken, 1) + batch(queue, events.MANY + 10)[10:]
        events._send(made)
    finally:
        redis_client().delete(events.stream_key(broken))
    assert [e["jobId"] for e in entries(queue)] == [f"job-{i}" for i in range(events.MANY + 10)]


def test_a_big_batch_counts_each_event_once():
    queue = unique("events")
    made = batch(queue, events.MANY * 3)  # 48: twelve of each kind
    events._send(made)
    events._send(made)  # sent again (a caller retrying): written again, counted once
    assert counters(queue) == {
        f"{kind}{metrics.NAME_SEPARATOR}test.echo": events.MANY * 3 // 4
        for kind in ("waiting", "active", "completed", "failed")
    }
    assert len(list(events.read([queue]))) == 2 * events.MANY * 3
