"""A consumer bootstep that gives back prefetch slots held by messages no task has.

kombu's Redis consumer sends BRPOP only while its QoS has a free prefetch
slot, and a slot is freed by the message's ack or reject. A slot whose
message never reaches an ack — held in kombu's QoS while no request of this
worker (running, reserved, waiting out an ETA or a rate limit) carries that
message — is held for good; once every slot is held so, the worker consumes
nothing again while looking alive (its loop, timers and remote control all
run). Keel's transport frees a slot when the ack itself fails
(``tasks.transport.QoS``); this watch is the net under that and any other
path: every ``CHECK_S`` it compares the slots held with the requests this
worker knows, and a slot orphaned for ``ORPHAN_S`` is given back, with an
error line naming how many. The message's unacked copy stays in Redis and
comes back after the visibility timeout, where Keel's claim decides.

Only for transports whose QoS keeps its deliveries locally (kombu's virtual
transports: Redis); RabbitMQ counts prefetch on the server.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import bootsteps
from celery.worker import state

log = logging.getLogger(__name__)

CHECK_S = 5.0
ORPHAN_S = 30.0


def _held(qos: Any) -> set[Any] | None:
    delivered, dirty = getattr(qos, "_delivered", None), getattr(qos, "_dirty", None)
    if delivered is None or dirty is None:
        return None
    return set(delivered) - set(dirty)


def _known() -> set[Any]:
    tags = set()
    for request in list(state.reserved_requests):  # reserved includes active ones
        message = getattr(request, "message", None)
        tag = getattr(message, "delivery_tag", None)
        if tag is not None:
            tags.add(tag)
    return tags


class SlotWatch:
    """When each held slot was first seen without a request; frees those orphaned too long."""

    def __init__(self) -> None:
        self.orphan_since: dict[Any, float] = {}

    def check(self, qos: Any, now: float | None = None) -> int:
        """Free the slots orphaned for ``ORPHAN_S``; how many were freed."""
        held = _held(qos)
        if held is None:
            return 0
        now = time.monotonic() if now is None else now
        orphans = held - _known()
        self.orphan_since = {t: self.orphan_since.get(t, now) for t in orphans}
        stale = [t for t, since in self.orphan_since.items() if now - since >= ORPHAN_S]
        for tag in stale:
            qos._quick_ack(tag)  # the local slot only: Redis's unacked copy is left alone
            del self.orphan_since[tag]
        if stale:
            log.error(
                "consumer: %d prefetch slots were held for %.0f s by messages no task has; "
                "given back (their messages return after the visibility timeout)",
                len(stale),
                ORPHAN_S,
            )
        return len(stale)


class PrefetchWatch(bootsteps.StartStopStep):
    """Runs ``SlotWatch`` on the consumer's timer while the consumer runs."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.tref: Any = None
        self.watch = SlotWatch()

    def start(self, c: Any) -> None:
        self.watch = SlotWatch()  # a restarted consumer has a new channel and QoS
        self.tref = c.timer.call_repeatedly(CHECK_S, self._check, (c,))

    def _check(self, c: Any) -> None:
        consumer = getattr(c, "task_consumer", None)
        channel = getattr(consumer, "channel", None)
        qos = getattr(channel, "qos", None)
        if qos is not None:
            self.watch.check(qos)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            c.timer.cancel(self.tref)
            self.tref = None

    shutdown = stop
