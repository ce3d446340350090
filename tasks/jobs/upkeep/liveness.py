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

``python -m tasks.jobs.upkeep.healthcheck worker|beat`` is a container health check
for the processes of its own host. It must not fail on a Redis blip (a
restarted container loses its running jobs), so each beat also writes a
small local file, ``$KEEL_HOME/alive/<role>@<node>``, on the same timer,
whether or not Redis answered: its age says the process's loop runs, and
what it holds says when Redis last took a heartbeat.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
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


def local_dir() -> Path:
    return get_settings().home / "alive"


def local_path(role: str, member: str) -> Path:
    return local_dir() / f"{role}.{member.replace('/', '_')}"


def beat_locally(
    role: str, member: str, redis_ok_at: float | None, reconnecting: bool = False
) -> None:
    """This process's loop ran now; Redis last took its heartbeat at ``redis_ok_at``.

    ``reconnecting``: the consumer stopped to reconnect to the broker (its timer
    stops with it), so no beat follows until it is back.
    Written to a temporary file and renamed, so a reader never sees half of it.
    """
    path = local_path(role, member)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            entry = {"pid": os.getpid(), "at": time.time(), "redis_ok_at": redis_ok_at}
            json.dump({**entry, "reconnecting": reconnecting}, out)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home: the Redis heartbeat still counts
        log.debug("local heartbeat not written: %s", exc)


def forget_locally(role: str, member: str) -> None:
    with contextlib.suppress(OSError):
        local_path(role, member).unlink()


def local_beats(role: str) -> list[dict[str, Any]]:
    """This host's local heartbeats of ``role``: each with its ``member`` and ``age_s``."""
    found = []
    try:
        paths = sorted(local_dir().glob(f"{role}.*"))
    except OSError:
        return []
    now = time.time()
    for path in paths:
        try:
            entry = json.loads(path.read_text())
            entry.update(member=path.name[len(role) + 1 :], age_s=now - float(entry["at"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(entry)
    return found


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
        self.redis_ok_at: float | None = None

    def start(self, c: Any) -> None:
        self.client = quick_client()
        self._beat(c.hostname)
        self.tref = c.timer.call_repeatedly(HEARTBEAT_S, self._beat, (c.hostname,))

    def _beat(self, hostname: str) -> None:
        if self.client is None:
            return
        try:
            beat(self.client, "worker", hostname)
            self.redis_ok_at = time.time()
        except redis.RedisError as exc:  # readiness will say so; the worker goes on
            log.warning("worker heartbeat not recorded: %s", exc)
        beat_locally("worker", hostname, self.redis_ok_at)

    def stop(self, c: Any) -> None:
        """The consumer stops: to reconnect to the broker (it starts again), or for good."""
        if self.tref is not None:
            c.timer.cancel(self.tref)
            self.tref = None
        beat_locally("worker", c.hostname, self.redis_ok_at, reconnecting=True)
        if self.client is not None:
            with contextlib.suppress(redis.RedisError):
                forget(self.client, "worker", c.hostname)

    def shutdown(self, c: Any) -> None:
        """The worker exits."""
        self.stop(c)
        forget_locally("worker", c.hostname)

    terminate = shutdown
