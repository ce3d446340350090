"""A worker's prefetch slots: given back when no task has their message, and watched for a wedge.

kombu's Redis consumer sends BRPOP only while its QoS has a free prefetch
slot, and a slot is freed by the message's ack or reject. A slot whose
message never reaches an ack — held in kombu's QoS while no request of this
worker (running, reserved, waiting out an ETA or a rate limit) carries that
message — is held for good; once every slot is held so, the worker consumes
nothing again while looking alive (its loop, timers and remote control all
run). Keel's transport frees a slot when the ack itself fails
(``tasks.platform.transport.QoS``); ``PrefetchWatch`` is the net under that and any
other path: every ``CHECK_S`` it compares the slots held with the requests
this worker knows, and a slot orphaned for ``KEEL_PREFETCH_ORPHAN_S`` (30 s;
0: never) is given back, with an error line naming how many. A message's
unacked copy, if kombu kept one, stays in Redis and comes back after the
visibility timeout, where Keel's claim decides; a recorded job's message has
none, and the reconciler publishes the job again if its record still waits.

``ConsumerWatch`` says whether the consumer is wedged — consuming nothing
although it should — for the worker's heartbeat (``tasks.jobs.upkeep.liveness``),
which the health check reads (``tasks.jobs.upkeep.healthcheck``). Two shapes:

- every prefetch slot is held and no request of the worker carries any of
  them (what the lost acks left: no BRPOP is ever sent again);
- a slot is free, messages wait in the worker's queues, and it received
  none since the previous look (its poll is not sent, or its reply is never
  read).

A busy worker (its slots carried by running or reserved tasks) and an idle
one (nothing waiting) are not wedged.

Only for transports whose QoS keeps its deliveries locally (kombu's virtual
transports: Redis); RabbitMQ counts prefetch on the server.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import bootsteps
from celery.signals import task_received
from celery.worker import state

from tasks.platform.config import get_settings

log = logging.getLogger(__name__)

CHECK_S = 5.0

# Task messages this process's consumer received (Celery's ``task_received``).
_received = [0]


@task_received.connect(weak=False)
def _count_received(sender: Any = None, **kwargs: Any) -> None:
    _received[0] += 1


def qos_of(consumer: Any) -> Any | None:
    """The consumer's kombu QoS, if it keeps its deliveries locally (Redis); else None."""
    task_consumer = getattr(consumer, "task_consumer", None)
    channel = getattr(task_consumer, "channel", None)
    qos = getattr(channel, "qos", None)
    if qos is None or _held(qos) is None:
        return None
    return qos


def _held(qos: Any) -> set[Any] | None:
    delivered, dirty = getattr(qos, "_delivered", None), getattr(qos, "_dirty", None)
    if delivered is None or dirty is None:
        return None
    return set(delivered) - set(dirty)


def _known(consumer: Any = None) -> set[Any]:
    """Delivery tags of every request this worker has: reserved (running ones included),
    waiting out an ETA, or held in a rate limit's bucket."""
    requests = [*state.reserved_requests, *state.active_requests, *state.scheduled_requests]
    for bucket in list((getattr(consumer, "task_buckets", None) or {}).values()):
        for entry in list(getattr(bucket, "contents", ()) or ()):
            requests.append(entry[0] if isinstance(entry, tuple) else entry)
    tags = set()
    for request in requests:
        message = getattr(request, "message", None)
        tag = getattr(message, "delivery_tag", None)
        if tag is not None:
            tags.add(tag)
    return tags


def queue_keys(consumer: Any) -> list[str]:
    """The Redis lists the consumer's BRPOP names (each queue's priority lists); [] if none."""
    task_consumer = getattr(consumer, "task_consumer", None)
    channel = getattr(task_consumer, "channel", None)
    q_for_pri = getattr(channel, "_q_for_pri", None)
    if channel is None or q_for_pri is None:
        return []
    prefix = getattr(channel, "global_keyprefix", "") or ""
    steps = getattr(channel, "priority_steps", None) or [0]
    return [
        f"{prefix}{q_for_pri(queue, step)}"
        for queue in list(channel.active_queues)
        for step in steps
    ]


class SlotWatch:
    """When each held slot was first seen without a request; frees those orphaned too long."""

    def __init__(self, orphan_s: float | None = None) -> None:
        self.orphan_s = get_settings().prefetch_orphan_s if orphan_s is None else orphan_s
        self.orphan_since: dict[Any, float] = {}

    def check(self, qos: Any, now: float | None = None, consumer: Any = None) -> int:
        """Free the slots orphaned for ``orphan_s``; how many were freed."""
        held = _held(qos)
        if held is None:
            return 0
        now = time.monotonic() if now is None else now
        orphans = held - _known(consumer)
        self.orphan_since = {t: self.orphan_since.get(t, now) for t in orphans}
        stale = [t for t, since in self.orphan_since.items() if now - since >= self.orphan_s]
        for tag in stale:
            qos._quick_ack(tag)  # the local slot only: Redis's unacked copy is left alone
            del self.orphan_since[tag]
        if stale:
            log.error(
                "consumer: %d prefetch slots were held for %.0f s by messages no task has; "
                "given back (an unacked copy returns after the visibility timeout; a "
                "recorded job still waiting is published again by the reconciler)",
                len(stale),
                self.orphan_s,
            )
        return len(stale)


class PrefetchWatch(bootsteps.StartStopStep):
    """Runs ``SlotWatch`` on the consumer's timer while the consumer runs
    (not at all when ``KEEL_PREFETCH_ORPHAN_S`` is 0)."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.tref: Any = None
        self.watch = SlotWatch()

    def start(self, c: Any) -> None:
        self.watch = SlotWatch()  # a restarted consumer has a new channel and QoS
        if self.watch.orphan_s <= 0:
            log.info("consumer: orphaned prefetch slots are not given back (0 s)")
            return
        self.tref = c.timer.call_repeatedly(CHECK_S, self._check, (c,))

    def _check(self, c: Any) -> None:
        qos = qos_of(c)
        if qos is not None:
            self.watch.check(qos, consumer=c)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            c.timer.cancel(self.tref)
            self.tref = None

    shutdown = stop


class ConsumerWatch:
    """Whether a consumer is wedged, and since when: one look per heartbeat.

    ``look`` is given the number of messages that were waiting in the
    consumer's queues at the previous look (read from Redis with the
    heartbeat; None: unknown), and answers what it found, for the heartbeat.
    """

    def __init__(self) -> None:
        self.received = _received[0]
        self.could_consume = False
        self.stuck: str | None = None
        self.kind: str | None = None
        self.since: float | None = None

    def look(
        self, consumer: Any, waiting: int | None, now: float | None = None
    ) -> dict[str, Any] | None:
        """What the consumer's slots say now: counts, and ``stuck`` (why it consumes nothing
        although it should, None if it consumes) with ``stuck_for_s``. None without a local QoS."""
        now = time.monotonic() if now is None else now
        qos = qos_of(consumer)
        received, got = _received[0], _received[0] != self.received
        self.received = received
        if qos is None:
            self.could_consume, self.kind, self.since = False, None, None
            return None
        held = _held(qos) or set()
        orphaned = len(held - _known(consumer))
        prefetch = getattr(qos, "prefetch_count", None) or 0
        can = bool(qos.can_consume())
        kind, why = None, None
        if not can and held and orphaned == len(held):
            kind = "slots"
            why = (
                f"every prefetch slot ({len(held)} of {prefetch}) held by messages "
                "no task of this worker has"
            )
        elif can and self.could_consume and waiting and not got:
            kind = "poll"
            why = (
                f"a prefetch slot free and {waiting} message{'' if waiting == 1 else 's'} "
                "waiting in its queues, none received"
            )
        self.could_consume = can
        if kind is None or kind != self.kind:
            self.since = now if kind is not None else None
        self.kind = kind
        return {
            "prefetch": prefetch,
            "held": len(held),
            "orphaned": orphaned,
            "can_consume": can,
            "waiting": waiting,
            "received": received,
            "stuck": why,
            "stuck_for_s": 0.0 if self.since is None else round(now - self.since, 1),
        }
