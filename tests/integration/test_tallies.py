"""Counts kept in a process and added to several Redis hashes at once, each once
(``tasks.platform.tallies``): what the job metrics of every worker process go through."""

from __future__ import annotations

import os
import time

import redis

from tasks.jobs.observe import events, metrics
from tasks.platform import tallies
from tasks.platform.broker import redis_client
from tests.support.client import unique


class LostReply(redis.Redis):
    """The real Redis, whose reply to a script is lost on the way back."""

    def execute_command(self, *args, **options):
        reply = super().execute_command(*args, **options)
        if args[0] == "EVAL":
            raise redis.TimeoutError("reply lost")
        return reply


def hashes(*keys: str) -> list[dict[bytes, bytes]]:
    return [redis_client().hgetall(key) for key in keys]


def test_counts_of_several_hashes_go_in_one_flush_integers_and_floats(stack):
    tally = tallies.Tally(f"test:applied:{unique()}", 60, "test-tally")
    first, second = f"test:{unique('a')}", f"test:{unique('b')}"
    tally.add(first, "done", 2)
    tally.add(second, "done")
    tally.add(first, "done")
    tally.add_float(second, "sum", 0.25)
    tally.add_float(second, "sum", 0.5)
    # Nothing reaches Redis before the flush
    assert hashes(first, second) == [{}, {}]
    assert tally.flush() is True
    assert hashes(first, second) == [{b"done": b"3"}, {b"done": b"1", b"sum": b"0.75"}]
    # and a flush with nothing new sends nothing
    assert tally.flush() is True
    assert hashes(first, second) == [{b"done": b"3"}, {b"done": b"1", b"sum": b"0.75"}]


def test_a_flush_whose_reply_was_lost_counts_once_in_every_hash(stack, monkeypatch):
    applied = f"test:applied:{unique()}"
    tally = tallies.Tally(applied, 60, "test-tally")
    first, second = f"test:{unique('a')}", f"test:{unique('b')}"
    tally.add(first, "n")
    tally.add_float(second, "sum", 1.5)
    lost = LostReply.from_url(os.environ["KEEL_REDIS_URL"])
    monkeypatch.setattr(tallies, "redis_client", lambda: lost)
    assert tally.flush() is False
    tally.add(first, "n", 4)  # counted meanwhile: the next number's
    monkeypatch.undo()
    assert tally.flush() is True
    assert hashes(first, second) == [{b"n": b"5"}, {b"sum": b"1.5"}]
    # A graceful close forgets the process's flush number
    assert redis_client().hexists(applied, tally.process)
    tally.close()
    assert not redis_client().hexists(applied, tally.process)


def test_an_event_counts_once_even_when_its_pipeline_is_sent_again(stack):
    queue = unique("tally")
    metrics.flush()
    event = events.Event(queue, "completed", unique("job"), "t.job", observed=("duration", 0.2))
    for _ in range(2):  # a publish that failed, then the event sent on its own
        pipe = redis_client().pipeline(transaction=False)
        event.add_to(pipe)
    event.send()
    assert metrics.flush() is True
    found = metrics.snapshot([queue])[queue]
    assert found["events"] == {("completed", "t.job"): 1}
    assert found["duration"]["t.job"] == {"0.25": 1.0, "sum": 0.2, "count": 1.0}


def test_a_key_of_another_type_fails_its_own_entry_and_the_flush_is_recorded_once(stack):
    tally = tallies.Tally(f"test:applied:{unique()}", 60, "test-tally")
    good, wrong = f"test:{unique('good')}", f"test:{unique('wrong')}"
    redis_client().set(wrong, "a string, not a hash")
    tally.add(good, "n")
    tally.add(wrong, "n")
    assert tally.flush() is True
    tally.add(good, "n")
    assert tally.flush() is True
    # The good entry counted once per flush; the wrong key is left as it was
    assert hashes(good) == [{b"n": b"2"}]
    assert redis_client().get(wrong) == b"a string, not a hash"


def test_after_close_the_thread_sends_nothing(stack):
    applied = f"test:applied:{unique()}"
    tally = tallies.Tally(applied, 0.05, "test-tally")
    key = f"test:{unique('closed')}"
    tally.add(key, "n")
    tally.close()
    assert hashes(key) == [{b"n": b"1"}] and not redis_client().hexists(applied, tally.process)
    tally.add(key, "n")  # after the end: nobody sends it
    time.sleep(0.3)
    assert hashes(key) == [{b"n": b"1"}]
