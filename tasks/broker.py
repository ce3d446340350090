"""One Redis client per process, for everything Keel keeps in Redis besides Celery's queues."""

from __future__ import annotations

import os

import redis

from tasks.config import get_settings

_state: dict[str, object] = {}


def redis_client() -> redis.Redis:
    if _state.get("pid") != os.getpid():
        _state["client"] = redis.Redis.from_url(
            get_settings().broker_url,
            socket_timeout=5,
            socket_connect_timeout=2,
            health_check_interval=30,
        )
        _state["pid"] = os.getpid()
    return _state["client"]  # type: ignore[return-value]
