"""What a worker's heartbeat says about its consumer, and what the health check makes of it.

A wedged consumer (it consumes nothing although it should) is reported once
that lasted ``liveness.WEDGED_S`` (60 s); a busy or idle one never is, and
neither is one stuck for less (the slots' own repair takes at most 45 s).
Fake consumers here; ``tests/integration/test_health_wedge.py`` wedges real workers.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from tasks.jobs.run import slots
from tasks.jobs.run.slots import ConsumerWatch, SlotWatch
from tasks.jobs.upkeep import healthcheck, liveness
from tasks.platform.config import Settings


class FakeQoS:
    """kombu's virtual QoS as far as the watches read it."""

    def __init__(self, prefetch_count: int) -> None:
        self.prefetch_count = prefetch_count
        self._delivered: dict = {}
        self._dirty: set = set()

    def take(self, tag: str) -> None:
        self._delivered[tag] = object()

    def _quick_ack(self, tag: str) -> None:
        self._dirty.add(tag)

    def can_consume(self) -> bool:
        return len(self._delivered) - len(self._dirty) < self.prefetch_count


def consumer_of(qos, buckets=None):
    channel = SimpleNamespace(qos=qos)
    return SimpleNamespace(task_consumer=SimpleNamespace(channel=channel), task_buckets=buckets)


class Request:
    def __init__(self, tag: str) -> None:
        self.message = SimpleNamespace(delivery_tag=tag)


@pytest.fixture
def carried():
    """Requests put in Celery's worker state for the test (removed after)."""
    from celery.worker import state

    added = []

    def carry(tag: str, where=state.reserved_requests) -> Request:
        request = Request(tag)
        where.add(request)
        added.append((where, request))
        return request

    yield carry
    for where, request in added:
        where.discard(request)


def looks(watch, consumer, waiting, times):
    return [watch.look(consumer, waiting, now=t) for t in times]


def test_an_idle_consumer_is_not_stuck():
    qos = FakeQoS(3)
    seen = looks(ConsumerWatch(), consumer_of(qos), 0, range(0, 120, 2))
    assert all(s["stuck"] is None and s["can_consume"] for s in seen)
    assert liveness.wedged(seen[-1]) is None


def test_a_busy_consumer_is_not_stuck_whatever_waits(carried):
    qos = FakeQoS(2)
    keep = [carried("running"), carried("reserved")]
    qos.take("running")
    qos.take("reserved")
    seen = looks(ConsumerWatch(), consumer_of(qos), 50, range(0, 120, 2))
    assert all(s["stuck"] is None and not s["can_consume"] for s in seen)
    assert seen[-1]["held"] == 2 and seen[-1]["orphaned"] == 0
    assert keep


def test_every_slot_held_by_no_request_is_stuck_and_wedged_after_60_s(carried):
    qos = FakeQoS(3)
    for n in range(3):
        qos.take(f"orphan-{n}")
    watch, consumer = ConsumerWatch(), consumer_of(qos)
    first = watch.look(consumer, 0, now=100.0)
    assert first["stuck"] == (
        "every prefetch slot (3 of 3) held by messages no task of this worker has"
    )
    at_59 = watch.look(consumer, 0, now=159.0)
    assert at_59["stuck_for_s"] == 59.0 and liveness.wedged(at_59) is None
    at_61 = watch.look(consumer, 0, now=161.0)
    assert liveness.wedged(at_61) == (
        "consumer wedged: every prefetch slot (3 of 3) held by messages no task of this "
        "worker has for 61 s (limit 60 s)"
    )
    # a heartbeat written 5 s ago, stuck 56 s then: stuck 61 s now
    assert liveness.wedged(watch.look(consumer, 0, now=156.0) | {"stuck_for_s": 56.0}, 5.0)
    # one slot carried by a request: it is busy (one task), not wedged
    carried("orphan-0")
    assert watch.look(consumer, 0, now=170.0)["stuck"] is None


def test_slots_held_by_eta_and_rate_limited_requests_are_not_orphans(carried):
    from celery.worker import state

    qos = FakeQoS(3)
    for tag in ("eta", "limited", "orphan"):
        qos.take(tag)
    carried("eta", state.scheduled_requests)
    bucket = SimpleNamespace(contents=[(Request("limited"), 1)])
    consumer = consumer_of(qos, buckets={"test.echo": bucket})
    seen = ConsumerWatch().look(consumer, 0, now=0.0)
    assert seen["orphaned"] == 1 and seen["stuck"] is None
    watch = SlotWatch(orphan_s=30)
    assert watch.check(qos, now=0.0, consumer=consumer) == 0
    assert watch.check(qos, now=31.0, consumer=consumer) == 1
    assert set(qos._delivered) - qos._dirty == {"eta", "limited"}


def test_a_free_slot_with_messages_waiting_and_none_received_is_stuck():
    qos = FakeQoS(3)
    watch, consumer = ConsumerWatch(), consumer_of(qos)
    # messages waited at each look's previous beat; none was received in between
    assert watch.look(consumer, None, now=0.0)["stuck"] is None
    assert watch.look(consumer, 4, now=2.0)["stuck"] == (
        "a prefetch slot free and 4 messages waiting in its queues, none received"
    )
    assert watch.look(consumer, 4, now=63.0)["stuck_for_s"] == 61.0
    # one received: it consumes
    slots._count_received()
    assert watch.look(consumer, 3, now=65.0)["stuck"] is None
    # Redis did not say what waits: nothing to judge
    assert watch.look(consumer, None, now=67.0)["stuck"] is None
    assert watch.look(consumer, 0, now=69.0)["stuck"] is None


def test_no_local_qos_no_judgement():
    rabbit = SimpleNamespace(task_consumer=SimpleNamespace(channel=SimpleNamespace(qos=object())))
    assert ConsumerWatch().look(rabbit, 10, now=0.0) is None
    assert slots.queue_keys(rabbit) == []


def entry(stuck_for_s: float, age_s: float = 1.0, **more) -> dict:
    stuck = "every prefetch slot (3 of 3) held by messages no task of this worker has"
    consumer = {"stuck": stuck if stuck_for_s else None, "stuck_for_s": stuck_for_s}
    return {"redis_ok_at": 1000.0 - age_s, "age_s": age_s, "consumer": consumer, **more}


def test_the_health_check_reports_a_consumer_stuck_60_s_only():
    judge = lambda e: healthcheck._judge(e, grace=60.0, now=1000.0)  # noqa: E731
    assert judge(entry(0)) is None
    assert judge(entry(45)) is None  # the slots' own repair may still come
    assert judge(entry(58.5, age_s=1.0)) is None
    assert judge(entry(60.0, age_s=1.0)) == (
        "consumer wedged: every prefetch slot (3 of 3) held by messages no task of this "
        "worker has for 61 s (limit 60 s)"
    )
    # reconnecting to the broker: its consumer is to come back, nothing to judge
    assert judge(entry(90, reconnecting=True)) is None
    # cut from Redis past the grace: said first
    assert judge(entry(90, age_s=70)).startswith("cut from redis")


def test_the_orphan_time_is_a_setting_of_0_to_45_s():
    assert Settings(redis_url="redis://x").prefetch_orphan_s == 30
    assert Settings(redis_url="redis://x", prefetch_orphan_s=0).prefetch_orphan_s == 0
    with pytest.raises(ValidationError):
        Settings(redis_url="redis://x", prefetch_orphan_s=50)
    with pytest.raises(ValidationError):
        Settings(redis_url="redis://x", prefetch_orphan_s=-1)
