"""A broker that lost its data: the epoch check republishes only what the broker lacks.

Real Postgres and Redis, no worker on the test's queue. A job published after
the broker came back (beat's first fire on a fresh ``keel up``) already has
its message: republishing it made a duplicate delivery and a warning on
every fresh start.
"""

from __future__ import annotations

import json

import pytest

from tasks.jobs import add
from tasks.jobs.upkeep.broker_reset import EPOCH_KEY, check_epoch
from tasks.platform.broker import redis_client
from tests.support.chaos import priority_lists
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def queued_ids(queue: str) -> list[str]:
    client = redis_client()
    raw = [item for name in priority_lists(queue) for item in client.lrange(name, 0, -1)]
    return sorted(json.loads(item)["headers"]["id"] for item in raw)


def lose_messages(queue: str) -> None:
    """What a Redis restarted empty did to ``queue``: its lists are gone."""
    redis_client().delete(*priority_lists(queue))


def test_a_fresh_broker_with_every_message_in_place_republishes_nothing(caplog):
    # Given a broker without its epoch (fresh) whose waiting job was published after it started
    queue = unique("fresh-epoch")
    job_id = add("test.echo", {"i": 1}, queue=queue).job_id
    redis_client().delete(EPOCH_KEY)
    # When the first promoter checks the epoch
    assert check_epoch() is True
    # Then the job keeps its one message, and nothing is logged as lost
    assert queued_ids(queue) == [job_id]
    assert "broker epoch was missing" not in caplog.text


def test_a_broker_that_lost_its_messages_gets_one_per_waiting_job(caplog):
    # Given waiting jobs whose messages a Redis restart lost, and one published after it
    queue = unique("lost-epoch")
    lost = sorted(add("test.echo", {"i": i}, queue=queue).job_id for i in range(3))
    lose_messages(queue)
    redis_client().delete(EPOCH_KEY)
    kept = add("test.echo", {"i": 9}, queue=queue).job_id
    # When the epoch is checked (twice: only the first process to notice acts)
    assert (check_epoch(), check_epoch()) == (True, False)
    # Then the lost jobs have one message each again, and the kept one still has one
    assert queued_ids(queue) == sorted([*lost, kept])
    assert "republished 3 waiting jobs" in caplog.text
