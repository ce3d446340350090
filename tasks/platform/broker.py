"""One Redis client per process, and how long to trust Redis and the broker after a timeout.

Redis answers in well under a millisecond, so a reply that takes
``REDIS_TIMEOUT_S`` means Redis is hung. Once a call has waited that long
for nothing, the process treats Redis as unreachable for ``UNREACHABLE_S``:
events are dropped and new jobs are parked for the promoter instead of
published, so a hung Redis costs one timeout per process and period rather
than one per call — ``POST /reports`` keeps answering 202 at once. A refused
connection (Redis down, not hung) fails at once and costs nothing, so it
does not count.

Celery's messages go through that same Redis unless ``KEEL_BROKER_URL``
names RabbitMQ. Then publishing has its own account (``publish_unreachable``,
``publish_failed``): a hung RabbitMQ parks new jobs without silencing
events, and a hung Redis drops events without parking jobs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import redis

from tasks.platform.config import get_settings
from tasks.platform.rabbitmq import CONFIRM_TIMEOUT_S

log = logging.getLogger(__name__)

REDIS_TIMEOUT_S = 0.5
UNREACHABLE_S = 2.0
# What "Redis is down or did not answer" looks like to redis-py.
UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
# The longest a call waits for each server before it counts as hung.
TIMEOUTS_S = {"Redis": REDIS_TIMEOUT_S, "RabbitMQ": CONFIRM_TIMEOUT_S}

_state: dict[str, object] = {}
_unreachable_until = {"Redis": 0.0, "RabbitMQ": 0.0}


def redis_client() -> redis.Redis:
    if _state.get("pid") != os.getpid():
        _state["client"] = redis.Redis.from_url(
            get_settings().redis,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            health_check_interval=30,
        )
        _state["pid"] = os.getpid()
    return _state["client"]  # type: ignore[return-value]


def unreachable(server: str = "Redis") -> bool:
    """Whether ``server`` failed to answer in this process within the last ``UNREACHABLE_S``."""
    return time.monotonic() < _unreachable_until[server]


def failed(exc: BaseException, started: float, server: str = "Redis") -> None:
    """A call to ``server`` begun at ``started`` (monotonic) failed with ``exc``.

    If it failed only after waiting for a timeout, skip that server for
    ``UNREACHABLE_S`` (logged once per period).
    """
    if time.monotonic() - started < TIMEOUTS_S[server] / 2:
        return
    if not unreachable(server):
        log.warning("%s is not answering (%s); skipping it for %.0f s", server, exc, UNREACHABLE_S)
    _unreachable_until[server] = time.monotonic() + UNREACHABLE_S


def message_broker() -> str:
    """The server that carries Celery's messages: ``"RabbitMQ"`` or ``"Redis"``."""
    return "RabbitMQ" if get_settings().broker_on_amqp else "Redis"


def publish_unreachable() -> bool:
    """Whether the message broker is known not to answer here: park, do not publish."""
    return unreachable(message_broker())


def publish_failed(exc: BaseException, started: float) -> None:
    """A publish begun at ``started`` failed with ``exc`` (see ``failed``)."""
    failed(exc, started, message_broker())


def publish(send: Callable[[Any], object], producer: Any = None) -> None:
    """Run ``send(producer)`` (one publish); on RabbitMQ, once more if it failed at once.

    A connection RabbitMQ closed (it restarted while this process was idle)
    fails the first publish on it at once; a second try on a new connection
    goes through: the given producer's connection is replaced in place (a
    batch goes on with it), or, with none given, kombu's pool opens one. A
    publish that failed after waiting is not tried again: the broker is hung,
    and a second wait would only double the caller's. Redis needs neither:
    redis-py reconnects by itself.
    """
    started = time.monotonic()
    try:
        send(producer)
    except Exception:
        server = message_broker()
        if server != "RabbitMQ" or time.monotonic() - started >= TIMEOUTS_S[server] / 2:
            raise
        log.info("publish failed at once; trying again on a new connection", exc_info=True)
        if producer is not None:
            connection = producer.connection
            connection.collect()  # no I/O: the old socket is gone or closing
            producer.revive(connection.default_channel)
        send(producer)
