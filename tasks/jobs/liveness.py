"""Heartbeats of worker and beat processes, for ``/readyz`` and container health checks.

Every worker refreshes an entry in a Redis sorted set (``keel:alive:worker``)
every ``HEARTBEAT_S`` from a consumer bootstep, on the consumer's own timer:
a worker whose event loop is stuck stops beating, like Celery's own
``worker-heartbeat``. Beat does the same from its tick. Entries are scored
with Redis's clock (``TIME`` inside a script), so hosts whose clocks differ
still agree on what "recent" means.

Why not Celery's heartbeat events: they are fan-out messages that only a
process subscribed at the time sees, so a readiness probe would have to
listen for a whole heartbeat interval, or every web process would have to
keep an event consumer running. A sorted-set read is one bounded command.

``python -m tasks.jobs.healthcheck worker|beat`` reads them for a container
health check.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import redis
from celery import bootsteps
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks.config import get_settings

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
FRESH_S = 10.0  # five missed beats: the process is gone or stuck
KEEP_S = 3600.0  # older entries are dropped when anyone beats
TIMEOUT_S = 1.0

# Scores come from Redis's clock, so writers and readers on different hosts agree.
BEAT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return 1
"""
FRESH_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""


def key(role: str) -> str:
    return f"keel:alive:{role}"


def quick_client() -> redis.Redis:
    """A client that fails within ``TIMEOUT_S`` instead of retrying: a probe must not hang."""
    return redis.Redis.from_url(
        get_settings().redis,
        socket_timeout=TIMEOUT_S,
        socket_connect_timeout=TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )


def beat(client: redis.Redis, role: str, member: str) -> None:
    client.eval(BEAT_SCRIPT, 1, key(role), member, KEEP_S)


def forget(client: redis.Redis, role: str, member: str) -> None:
    client.zrem(key(role), member)


def fresh(client: redis.Redis, role: str, within_s: float = FRESH_S) -> list[str]:
    """Members of ``role`` that beat within the last ``within_s`` seconds."""
    found = client.eval(FRESH_SCRIPT, 1, key(role), within_s)
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in found)


class Heartbeat(bootsteps.StartStopStep):
    """A consumer bootstep: beat as ``worker`` while this worker consumes.

    It starts after the ``Tasks`` step, once the task consumer is attached to
    the queues: a worker still starting (or still in mingle) is not ready.
    """

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.tref: Any = None
        self.client: redis.Redis | None = None

    def start(self, c: Any) -> None:
        self.client = quick_client()
        self._beat(c.hostname)
        self.tref = c.timer.call_repeatedly(HEARTBEAT_S, self._beat, (c.hostname,))

    def _beat(self, hostname: str) -> None:
        if self.client is None:
            return
        try:
            beat(self.client, "worker", hostname)
        except redis.RedisError as exc:  # readiness will say so; the worker goes on
            log.warning("worker heartbeat not recorded: %s", exc)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            c.timer.cancel(self.tref)
            self.tref = None
        if self.client is not None:
            with contextlib.suppress(redis.RedisError):
                forget(self.client, "worker", c.hostname)

    shutdown = stop
    terminate = stop
