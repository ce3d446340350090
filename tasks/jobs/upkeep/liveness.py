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

A worker's loop can run while its consumer takes nothing: every prefetch
slot held by a message no task has, or its poll never sent. So a worker's
beat also carries what its consumer looks like (``tasks.jobs.run.slots.ConsumerWatch``):
in the local file under ``consumer`` (its slots, the messages waiting in its
queues, and ``stuck``/``stuck_for_s``: why and for how long it has consumed
nothing although it should), and, while it is stuck, in Redis under
``keel:alive:worker:stuck:<member>`` (expiring with the heartbeat), for
``keel status``. Either reports the consumer wedged once that lasts
``WEDGED_S`` (60 s): longer than the slots' own repair takes
(``KEEL_PREFETCH_ORPHAN_S``, at most 45 s, checked every 5 s), so a worker
that mends itself is never reported.
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

from tasks.jobs.run import capacity
from tasks.jobs.run.slots import ConsumerWatch, queue_keys
from tasks.platform import broker
from tasks.platform.config import get_settings

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
FRESH_S = 10.0  # five missed beats: the process is gone or stuck
KEEP_S = 3600.0  # older entries are dropped when anyone beats
TIMEOUT_S = 1.0
WEDGED_S = 60.0  # a consumer that consumed nothing though it should, this long, is wedged

# Scores come from Redis's clock, so writers and readers on different hosts agree.
# KEYS[2]: the member's stuck consumer, set while ARGV[3] says one (expiring like a
# beat), else deleted; KEYS[3...]: the lists its consumer polls. Answers how many
# messages wait in them (a key of another type counts none).
BEAT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if KEYS[2] then
  if ARGV[3] ~= '' then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', math.floor(tonumber(ARGV[4]) * 1000))
  else
    redis.call('DEL', KEYS[2])
  end
end
local waiting = 0
for i = 3, #KEYS do
  local n = redis.pcall('LLEN', KEYS[i])
  if type(n) == 'number' then waiting = waiting + n end
end
return waiting
"""
FRESH_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""


LAST_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #last == 0 then return false end
return tostring(now - tonumber(last[2]))
"""


def local_dir() -> Path:
    return get_settings().home / "alive"


def local_path(role: str, member: str) -> Path:
    return local_dir() / f"{role}.{member.replace('/', '_')}"


def beat_locally(
    role: str,
    member: str,
    redis_ok_at: float | None,
    reconnecting: bool = False,
    consumer: dict[str, Any] | None = None,
) -> None:
    """This process's loop ran now; Redis last took its heartbeat at ``redis_ok_at``.

    ``reconnecting``: the consumer stopped to reconnect to the broker (its timer
    stops with it), so no beat follows until it is back. ``consumer``: what its
    consumer looks like now (``tasks.jobs.run.slots.ConsumerWatch.look``).
    Written to a temporary file and renamed, so a reader never sees half of it.
    """
    path = local_path(role, member)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            entry: dict[str, Any] = {
                "pid": os.getpid(),
                "at": time.time(),
                "redis_ok_at": redis_ok_at,
            }
            entry.update(reconnecting=reconnecting)
            if consumer is not None:
                entry.update(consumer=consumer)
            json.dump(entry, out)
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


def stuck_key(role: str, member: str) -> str:
    return f"{key(role)}:stuck:{member}"


def quick_client() -> redis.Redis:
    """A client that fails within ``TIMEOUT_S`` instead of retrying: a probe must not hang."""
    return broker.new_client(
        socket_timeout=TIMEOUT_S,
        socket_connect_timeout=TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )


def beat(
    client: redis.Redis,
    role: str,
    member: str,
    stuck: dict[str, Any] | None = None,
    lists: list[str] | None = None,
) -> int:
    """One heartbeat, with the member's stuck consumer (None: not stuck) when ``lists``
    is given; how many messages wait in ``lists``."""
    if lists is None:
        client.eval(BEAT_SCRIPT, 1, key(role), member, KEEP_S)
        return 0
    said = json.dumps(stuck) if stuck else ""
    keys = [key(role), stuck_key(role, member), *lists]
    return int(client.eval(BEAT_SCRIPT, len(keys), *keys, member, KEEP_S, said, FRESH_S))


def forget(client: redis.Redis, role: str, member: str) -> None:
    pipe = client.pipeline()
    pipe.zrem(key(role), member)
    pipe.delete(stuck_key(role, member))
    capacity.forget(pipe, member)
    pipe.execute()


def stuck(client: redis.Redis, role: str, members: list[str]) -> dict[str, dict[str, Any]]:
    """The members whose consumer said at its last beat that it was stuck: what it said."""
    if not members:
        return {}
    found = {}
    for member, raw in zip(
        members, client.mget([stuck_key(role, m) for m in members]), strict=True
    ):
        try:
            said = json.loads(raw) if raw else None
        except ValueError:
            continue
        if isinstance(said, dict):
            found[member] = said
    return found


def wedged(consumer: Any, age_s: float = 0.0) -> str | None:
    """What a heartbeat's ``consumer`` says is wedged (stuck ``WEDGED_S`` or longer), if it is:
    ``age_s`` is how long ago it was written (it has been stuck that much longer)."""
    if not isinstance(consumer, dict) or not consumer.get("stuck"):
        return None
    try:
        for_s = float(consumer.get("stuck_for_s") or 0.0) + max(0.0, age_s)
    except (TypeError, ValueError):
        return None
    if for_s < WEDGED_S:
        return None
    return f"consumer wedged: {consumer['stuck']} for {for_s:.0f} s (limit {WEDGED_S:.0f} s)"


def since_last(client: redis.Redis, role: str) -> float | None:
    """Seconds since any process of ``role`` last beat (Redis's clock); None: none ever did
    within ``KEEP_S``."""
    found = client.eval(LAST_SCRIPT, 1, key(role))
    return float(found) if found is not None else None


def fresh(client: redis.Redis, role: str, within_s: float = FRESH_S) -> list[str]:
    """Members of ``role`` that beat within the last ``within_s`` seconds."""
    found = client.eval(FRESH_SCRIPT, 1, key(role), within_s)
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in found)


def _pool_size(consumer: Any) -> int:
    """The worker's concurrency (its pool's processes or threads); 0 if it cannot be read."""
    size = getattr(getattr(consumer, "controller", None), "concurrency", None)
    return size if isinstance(size, int) and size > 0 else 0


def _queue_names(consumer: Any) -> list[str]:
    """The queues the worker consumes now (``-Q``, and any added since); [] if unknown."""
    queues = getattr(getattr(consumer, "task_consumer", None), "queues", None) or []
    return [name for name in (getattr(q, "name", None) for q in queues) if isinstance(name, str)]


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
        self.watch = ConsumerWatch()
        self.waiting: int | None = None
        self.said: str | None = None  # logged so far: None, "stuck" or "wedged"

    def start(self, c: Any) -> None:
        self.client = quick_client()
        self.watch, self.waiting = ConsumerWatch(), None  # a restarted consumer: a new QoS
        self._beat(c)
        self.tref = c.timer.call_repeatedly(HEARTBEAT_S, self._beat, (c,))

    def _beat(self, c: Any) -> None:
        if self.client is None:
            return
        hostname = c.hostname
        try:
            consumer = self.watch.look(c, self.waiting)
            lists = queue_keys(c) if consumer is not None else None
        except Exception:  # the beat itself must go on
            log.exception("the consumer's state could not be read")
            consumer, lists = None, None
        self._report(consumer)
        try:
            stuck = consumer if consumer is not None and consumer["stuck"] else None
            waiting = beat(self.client, "worker", hostname, stuck, lists)
            self.waiting = waiting if lists is not None else None
            capacity.record(self.client, hostname, _pool_size(c), _queue_names(c))
            self.redis_ok_at = time.time()
        except redis.RedisError as exc:  # readiness will say so; the worker goes on
            self.waiting = None
            log.warning("worker heartbeat not recorded: %s", exc)
        beat_locally("worker", hostname, self.redis_ok_at, consumer=consumer)

    def _report(self, consumer: dict[str, Any] | None) -> None:
        """A line when the consumer starts to consume nothing, and one when it is wedged."""
        stuck = consumer["stuck"] if consumer is not None else None
        if stuck is None:
            self.said = None
            return
        if self.said is None:
            log.warning("consumer consumes nothing: %s", stuck)
            self.said = "stuck"
        problem = wedged(consumer)
        if problem is not None and self.said != "wedged":
            log.error("%s; the worker's health check fails until it consumes again", problem)
            self.said = "wedged"

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
