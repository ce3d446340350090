"""The live workers' slots (how many jobs each runs at once), as their heartbeats say.

Each worker's heartbeat (``tasks.jobs.upkeep.liveness``) records its pool's size beside
its beat; the sum over the workers that beat recently is what the tenants' caps share
(``tasks.jobs.run.tenant_caps``). Read in one script, on Redis's clock as the beats are.
"""

from __future__ import annotations

import redis

ALIVE_KEY = "keel:alive:worker"  # liveness.key("worker"): the beats, scored by Redis's clock
SLOTS_KEY = f"{ALIVE_KEY}:slots"
FRESH_S = 10.0  # liveness.FRESH_S: a worker not heard from for this long is gone

# KEYS: beats, slots. ARGV: fresh seconds. The slots of the members that beat recently.
_LIVE_SLOTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local total = 0
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')) do
  total = total + (tonumber(redis.call('HGET', KEYS[2], member)) or 0)
end
return total
"""


def record(client: redis.Redis, member: str, slots: int) -> None:
    """The worker ``member`` runs ``slots`` jobs at once (its pool's processes or threads)."""
    client.hset(SLOTS_KEY, member, slots)


def live_slots(client: redis.Redis) -> int:
    """The slots of the workers alive now, added up; 0 when none is known."""
    return int(client.eval(_LIVE_SLOTS, 2, ALIVE_KEY, SLOTS_KEY, FRESH_S))
