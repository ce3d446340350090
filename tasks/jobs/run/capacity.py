"""The live workers' slots (how many jobs each runs at once), as their heartbeats say.

Each worker's heartbeat (``tasks.jobs.upkeep.liveness``) records its pool's size and the
queues it consumes beside its beat; what the workers that beat recently have, in all and
per queue, is what the tenants' caps share (``tasks.jobs.run.tenant_caps``). Read in one
script, on Redis's clock as the beats are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

ALIVE_KEY = "keel:alive:worker"  # liveness.key("worker"): the beats, scored by Redis's clock
SLOTS_KEY = f"{ALIVE_KEY}:slots"
QUEUES_KEY = f"{ALIVE_KEY}:queues"  # member → the JSON list of the queues it consumes
FRESH_S = 10.0  # liveness.FRESH_S: a worker not heard from for this long is gone

# KEYS: beats, slots, queues. ARGV: fresh seconds. Each member that beat recently: its
# slots and its queues (flat: slots, queues, slots, queues...).
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local found = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')) do
  table.insert(found, redis.call('HGET', KEYS[2], member) or '0')
  table.insert(found, redis.call('HGET', KEYS[3], member) or '[]')
end
return found
"""


@dataclass(frozen=True)
class Slots:
    """The live workers' slots: in all, and those of the workers that consume each queue
    (a worker of several queues counts its slots for each)."""

    total: int = 0
    per_queue: dict[str, int] = field(default_factory=dict)

    def of(self, queue: str) -> int:
        """The slots of the live workers that consume ``queue``; 0 when none is known."""
        return self.per_queue.get(queue, 0)


def record(client: redis.Redis, member: str, slots: int, queues: Iterable[str] = ()) -> None:
    """The worker ``member`` runs ``slots`` jobs at once (its pool's processes or threads),
    taken from ``queues``."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(SLOTS_KEY, member, slots)
    pipe.hset(QUEUES_KEY, member, json.dumps(sorted(set(queues))))
    pipe.execute()


def forget(pipe: redis.client.Pipeline, member: str) -> None:
    """Drop what ``member`` recorded (in ``pipe``: the worker's goodbye)."""
    pipe.hdel(SLOTS_KEY, member)
    pipe.hdel(QUEUES_KEY, member)


def live(client: redis.Redis) -> Slots:
    """The slots of the workers alive now, in all and per queue."""
    found = client.eval(_LIVE, 3, ALIVE_KEY, SLOTS_KEY, QUEUES_KEY, FRESH_S)
    total, per_queue = 0, dict[str, int]()
    for raw_slots, raw_queues in zip(found[::2], found[1::2], strict=True):
        slots = _int(raw_slots)
        total += slots
        for queue in _queues(raw_queues):
            per_queue[queue] = per_queue.get(queue, 0) + slots
    return Slots(total, per_queue)


def live_slots(client: redis.Redis) -> int:
    """The slots of the workers alive now, added up; 0 when none is known."""
    return live(client).total


def _int(raw: bytes | str) -> int:
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):
        return 0


def _queues(raw: bytes | str) -> list[str]:
    try:
        loaded = json.loads(raw)
    except ValueError:
        return []
    return [q for q in loaded if isinstance(q, str)] if isinstance(loaded, list) else []
