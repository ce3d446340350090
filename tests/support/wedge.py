"""Remote-control commands that wedge a real worker's consumer, for the health check's tests.

Loaded into a test worker with ``KEEL_JOB_MODULES=tests.support.wedge`` (it
declares no job). Each runs in the worker's consumer, on its event loop, as
Celery's own remote control does (``app.control.broadcast(name, destination=...)``):

- ``keel_test_hold_slots``: every prefetch slot taken by a delivery no
  request carries — what lost acks left behind (``tests/integration/test_prefetch_slots.py``);
  ``keel_test_free_slots`` gives them back;
- ``keel_test_stop_polling``: the consumer's channel sends no BRPOP any more
  (one in flight is still read), as if its poll were lost;
  ``keel_test_poll_again`` undoes it.
"""

from __future__ import annotations

from typing import Any

from celery.worker.control import control_command
from kombu.transport import virtual

ORPHAN_PREFIX = "wedge-orphan-"


class Orphan:
    """A delivery kombu holds a slot for; nothing of it is ever read."""

    delivery_info: dict[str, Any] = {}


def _channel(state: Any) -> Any:
    return state.consumer.task_consumer.channel


@control_command()
def keel_test_hold_slots(state: Any) -> dict[str, Any]:
    """Take every free prefetch slot with a delivery no request carries."""
    qos = _channel(state).qos
    taken = 0
    while qos.can_consume():
        virtual.QoS.append(qos, Orphan(), f"{ORPHAN_PREFIX}{taken}")
        taken += 1
    return {"ok": taken}


@control_command()
def keel_test_free_slots(state: Any) -> dict[str, Any]:
    """Give back the slots ``keel_test_hold_slots`` took (those still held)."""
    qos = _channel(state).qos
    tags = [t for t in set(qos._delivered) - set(qos._dirty) if str(t).startswith(ORPHAN_PREFIX)]
    for tag in tags:
        qos._quick_ack(tag)
    return {"ok": len(tags)}


def _no_poll(*args: Any, **kwargs: Any) -> None:
    return None


@control_command()
def keel_test_stop_polling(state: Any) -> dict[str, Any]:
    """The channel's BRPOP is never sent again (until ``keel_test_poll_again``)."""
    _channel(state)._brpop_start = _no_poll
    return {"ok": "stopped"}


@control_command()
def keel_test_poll_again(state: Any) -> dict[str, Any]:
    channel = _channel(state)
    channel.__dict__.pop("_brpop_start", None)
    return {"ok": "polling"}
