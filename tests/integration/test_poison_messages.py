"""Poison messages never kill a worker: they go to their queue's dead letters.

Given a real ``celery worker`` consuming every queue, when an item that is no
message lands in a queue's Redis list, then the worker lives, the item is in
that queue's dead-letter list exactly as it was pushed, a ``dead-lettered``
event says so, and the next job completes. ``keel deadletters`` lists and
drops them.
"""

from __future__ import annotations

import base64
import json
import time

import pytest
from click.testing import CliRunner

from keel.cli import main
from tasks.celery import app
from tasks.jobs.observe import events
from tasks.platform import deadletters
from tasks.platform.broker import redis_client
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import wait_for

pytestmark = pytest.mark.stack  # starts processes of its own

PRIORITY_SEP = "\x06\x16"  # kombu's separator between a queue and its priority list
ROUTE = {"exchange": "reports", "routing_key": "reports"}


@pytest.fixture(autouse=True)
def no_dead_letters(stack):
    yield
    client = redis_client()
    for queue in deadletters.queues(client):
        client.delete(deadletters.key(queue))


def letter_of(queue: str, raw: bytes, timeout: float = 30) -> deadletters.DeadLetter:
    def arrived():
        found = [
            letter
            for _, letter in deadletters.entries(redis_client(), queue)
            if letter.raw_bytes() == raw
        ]
        return found[0] if found else None

    return wait_for(arrived, timeout=timeout, interval=0.1)


def assert_alive_and_working(worker, client) -> None:
    assert worker.process.poll() is None, worker.log_tail()
    response = client.post(
        "/api/v1/reports", json={"reportId": unique(), "rows": 3}, headers=bearer()
    )
    assert response.status_code == 202, response.get_json()
    wait_state(response.get_json()["jobId"], "completed", timeout=60)
    assert worker.process.poll() is None, worker.log_tail()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def envelope(**overrides) -> bytes:
    """A kombu message as kombu's Redis transport stores it, with ``overrides`` applied."""
    message = {
        "body": b64("[[], {}, {}]"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": "report.generate", "id": unique("job")},
        "properties": {
            "body_encoding": "base64",
            "delivery_tag": unique("tag"),
            "delivery_info": ROUTE,
            "priority": 0,
        },
    }
    for path, value in overrides.items():
        *parents, leaf = path.split("__")
        target = message
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return json.dumps(message).encode()


def test_a_raw_non_json_item_is_dead_lettered_and_the_worker_keeps_consuming(worker, client):
    seconds, micros = redis_client().time()
    since = str(seconds * 1000 + micros // 1000 - 1)  # a stream id for "now"
    redis_client().lpush("reports", b"not json")

    letter = letter_of("reports", b"not json")
    assert (letter.queue, letter.source) == ("reports", "reports")
    assert letter.reason.startswith("not JSON")
    assert_alive_and_working(worker, client)
    seen = [e for e in events.read(["reports"], since=since) if e["event"] == "dead-lettered"]
    assert [e["deadLetterId"] for e in seen] == [letter.id]


@pytest.mark.parametrize("priority", [3, 6, 9])
def test_every_priority_list_of_a_queue_is_screened(worker, client, priority):
    source = f"reports{PRIORITY_SEP}{priority}"
    raw = f"not json at priority {priority}".encode()
    redis_client().lpush(source, raw)

    letter = letter_of("reports", raw)
    assert letter.source == source
    assert_alive_and_working(worker, client)


MALFORMED = {
    "json array": b"[1, 2, 3]",
    "json string": b'"just a string"',
    "empty object": b"{}",
    "no delivery tag": envelope(properties__delivery_tag=None),
    "no delivery info": envelope(properties__delivery_info=None),
    "no routing key": envelope(properties__delivery_info={"exchange": "reports"}),
    "body not base64": envelope(body="not base64!"),
    "not utf-8": b"\xff\xfe\x00 binary",
}


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_json_that_is_not_a_kombu_message_is_dead_lettered(worker, client, raw):
    redis_client().lpush("reports", raw)

    letter = letter_of("reports", raw)
    assert letter.raw_bytes() == raw
    assert_alive_and_working(worker, client)


NOT_FOR_CELERY = {
    "no task header": envelope(headers={"lang": "py"}),
    "no body": envelope(body=None),
    "no id": envelope(headers={"lang": "py", "task": "report.generate"}),
    "task name not a string": envelope(headers={"task": ["report.generate"], "id": "x"}),
    "body not json": envelope(body=b64("not json")),
    "body not [args, kwargs, embed]": envelope(body=b64("[1, 2]")),
    "time limit not seconds": envelope(headers__timelimit="zz"),
    "pickle": envelope(**{"content-type": "application/x-python-serialize"}),
}


@pytest.mark.parametrize("raw", NOT_FOR_CELERY.values(), ids=NOT_FOR_CELERY.keys())
def test_a_message_celery_cannot_take_as_a_task_is_kept_and_the_worker_lives(worker, client, raw):
    # kombu can read these; Celery's consumer rejects them, or would crash on them.
    tag = json.loads(raw)["properties"]["delivery_tag"]
    redis_client().lpush("reports", raw)

    def kept():
        letters = [letter for _, letter in deadletters.entries(redis_client(), "reports")]
        return [le for le in letters if json.loads(le.raw)["properties"]["delivery_tag"] == tag]

    [letter] = wait_for(kept, timeout=30)
    assert json.loads(letter.raw)["headers"] == json.loads(raw)["headers"]
    assert_alive_and_working(worker, client)


def test_an_unreadable_unacked_copy_is_moved_aside_and_restores_go_on(worker, client):
    # kombu keeps a copy of each reserved message; the visibility sweep re-reads them.
    client_ = redis_client()
    client_.hset("unacked", "poisoned-tag", b"not json either")
    client_.zadd("unacked_index", {"poisoned-tag": time.time() - 3600})

    letter = letter_of("unacked", b"not json either")
    assert letter.source == "unacked"
    assert client_.hget("unacked", "poisoned-tag") is None
    assert client_.zscore("unacked_index", "poisoned-tag") is None
    assert_alive_and_working(worker, client)


def test_keel_deadletters_lists_and_drops(stack):
    client_ = redis_client()
    kept = [
        deadletters.DeadLetter.of(q, q, f"junk {n}".encode(), "not JSON: test")
        for n, q in enumerate(["reports", "reports", "notifications"])
    ]
    for letter in kept:
        pipe = client_.pipeline()
        deadletters.add(pipe, letter)
        pipe.execute()
    runner = CliRunner()

    listed = runner.invoke(main, ["deadletters", "list"])
    assert listed.exit_code == 0, listed.output
    assert {json.loads(line)["id"] for line in listed.output.splitlines()} == {k.id for k in kept}
    only = runner.invoke(main, ["deadletters", "list", "--queue", "notifications"])
    assert [json.loads(line)["id"] for line in only.output.splitlines()] == [kept[2].id]

    dropped = runner.invoke(main, ["deadletters", "drop", kept[0].id])
    assert dropped.exit_code == 0 and "dropped 1" in dropped.output
    unknown = runner.invoke(main, ["deadletters", "drop", "no-such-id"])
    assert unknown.exit_code == 1
    assert runner.invoke(main, ["deadletters", "drop"]).exit_code == 2  # ids or --all
    everything = runner.invoke(main, ["deadletters", "drop", "--all", "--queue", "reports"])
    assert "dropped 1" in everything.output
    left = [letter.id for _, letter in deadletters.entries(client_, "notifications")]
    assert left == [kept[2].id] and deadletters.entries(client_, "reports") == []


def test_a_broadcast_that_is_json_but_no_message_is_dead_lettered(worker, client):
    # Celery's remote control broadcasts by pub/sub on /<db>.celery.pidbox
    assert redis_client().publish("/0.celery.pidbox", b"{}") == 1

    letter = wait_for(
        lambda: [
            letter
            for q in deadletters.queues(redis_client())
            for _, letter in deadletters.entries(redis_client(), q)
        ],
        timeout=30,
    )[0]
    assert letter.queue.endswith(".celery.pidbox") and json.loads(letter.raw) == {}
    assert_alive_and_working(worker, client)
    assert "Connection to broker lost" not in worker.log_tail(200)


def test_basic_get_skips_a_poison_item_to_the_message_behind_it(stack):
    # kombu's basic_get (SimpleQueue.get) pops with RPOP, not BRPOP; no worker reads this queue.
    with app.connection_for_write() as connection:
        probe = connection.SimpleQueue(unique("probe"))
        probe.put({"hello": "world"})
        redis_client().rpush(probe.queue.name, b"not json")  # RPOP takes it first

        message = probe.get(timeout=5)
        assert message.payload == {"hello": "world"}
        message.ack()
        probe.close()
    letter = letter_of(probe.queue.name, b"not json", timeout=1)
    assert letter.reason.startswith("not JSON")
