"""One Redis client per process, for everything Keel keeps in Redis besides Celery's queues.

Redis answers in well under a millisecond, so a reply that takes
``REDIS_TIMEOUT_S`` means Redis is hung. Once a call has waited that long
for nothing, the process treats Redis as unreachable for ``UNREACHABLE_S``:
events are dropped and new jobs are parked for the promoter instead of
published, so a hung Redis costs one timeout per process and period rather
than one per call — ``POST /reports`` keeps answering 202 at once. A refused
connection (Redis down, not hung) fails at once and costs nothing, so it
does not count.
"""

from __future__ import annotations

import logging
import os
import time

import redis

from tasks.config import get_settings

log = logging.getLogger(__name__)

REDIS_TIMEOUT_S = 0.5
UNREACHABLE_S = 2.0
# What "Redis is down or did not answer" looks like to redis-py.
UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)

_state: dict[str, object] = {}
_unreachable_until = {"at": 0.0}


def redis_client() -> redis.Redis:
    if _state.get("pid") != os.getpid():
        _state["client"] = redis.Redis.from_url(
            get_settings().broker_url,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            health_check_interval=30,
        )
        _state["pid"] = os.getpid()
    return _state["client"]  # type: ignore[return-value]


def unreachable() -> bool:
    """Whether Redis failed to answer in this process within the last ``UNREACHABLE_S``."""
    return time.monotonic() < _unreachable_until["at"]


def failed(exc: BaseException, started: float) -> None:
    """A call to Redis begun at ``started`` (monotonic) failed with ``exc``.

    If it failed only after waiting for a timeout, skip Redis for
    ``UNREACHABLE_S`` (logged once per period).
    """
    if time.monotonic() - started < REDIS_TIMEOUT_S / 2:
        return
    if not unreachable():
        log.warning("Redis is not answering (%s); skipping it for %.0f s", exc, UNREACHABLE_S)
    _unreachable_until["at"] = time.monotonic() + UNREACHABLE_S
