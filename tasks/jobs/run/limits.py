"""Global limits per queue, shared by every worker process: a concurrency cap and a rate limit.

Celery's ``-c`` and ``rate_limit`` hold per worker or per process; BullMQ's
global concurrency and limiter hold for the whole queue, whatever the number
of workers. ``KEEL_QUEUE_LIMITS`` (JSON) sets their defaults per queue, e.g.
``{"reports": {"concurrency": 4, "rate": {"max": 10, "duration_ms": 1000}}}``;
a queue it does not name is unlimited. Limits set live (``tasks.jobs.run.live_limits``:
the system API, ``keel queues limits``) replace those defaults on every worker within a
second; each admission passes the limit in force to Redis, so nothing there needs resetting.

Both live in Redis sorted sets and read Redis's clock, so all hosts agree.

- Concurrency: a semaphore of holder tokens scored by lease expiry. A
  holder renews its lease while its job runs, like the job lock, so a dead
  worker's slot frees itself within ``KEEL_LOCK_DURATION_S``. The slot is
  taken before the claim and given back after the outcome is recorded, so
  every recorded run lies inside its slot.
- Rate: a moving window of starts. A start is first *reserved* (it counts
  as if it were in the future) and, once the claim is committed, *stamped*
  with the time it happened. The recorded start (in Postgres) comes a
  variable few milliseconds after the token — hundreds on a loaded host —
  so stamping the token's time would let ``max + 1`` recorded starts share
  a window; stamping after the claim cannot. A delivery that turns out not
  to start (duplicate, finished job) withdraws its reservation.

A delivery that finds no slot or no start raises ``LimitReached``; the task
parks the job in the durable delayed set without claiming it, so waiting
costs no attempt and survives the worker.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.jobs.model.errors import ControlFlow
from tasks.jobs.run import live_limits
from tasks.platform.broker import redis_client
from tasks.platform.config import get_settings
from tasks.platform.setting_types import QueueLimit

log = logging.getLogger(__name__)

KEY_PREFIX = "keel:limits"
# A job turned away by the concurrency cap asks again after 0.25 to 0.5 s.
CONCURRENCY_HOLD_S = 0.25
# Jobs held by a blocked window ask again within this after it ends.
BLOCK_SPREAD_S = 0.25
# When Redis cannot say, hold rather than run past a limit.
UNKNOWN_HOLD_S = 1.0

NOW_US = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

# KEYS[1] holders; ARGV: token, concurrency, lease ms. 1 when the slot is taken.
_TAKE_SLOT = (
    NOW_US
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]) * 1000, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS: holders keys; ARGV: lease ms, then one token per key.
_RENEW_SLOTS = (
    NOW_US
    + """
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]) * 1000, ARGV[i + 1])
  redis.call('PEXPIRE', key, ARGV[1])
end
return #KEYS
"""
)

# KEYS[1] starts, KEYS[2] blocked until (µs); ARGV: token, max, window ms, reservation ms.
# 0 when reserved, else the µs until a start is allowed: the window is full until its oldest
# start leaves it; negative: a handler said its limiter is blocked for that long (``block``).
_RESERVE_START = (
    NOW_US
    + """
local blocked = tonumber(redis.call('GET', KEYS[2]) or '0')
if blocked > now then return now - blocked end
local window_us = tonumber(ARGV[3]) * 1000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window_us)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]) * 1000, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[4]))
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.min(window_us, math.max(1, tonumber(oldest[2]) + window_us - now))
"""
)

# KEYS[1] blocked until (µs); ARGV: ms. Blocks the window that long from now (a later end
# already set stays).
_BLOCK = (
    NOW_US
    + """
local ends = now + tonumber(ARGV[1]) * 1000
if tonumber(redis.call('GET', KEYS[1]) or '0') < ends then
  redis.call('SET', KEYS[1], string.format('%d', ends), 'PX', ARGV[1])
end
return 1
"""
)

# KEYS[1] starts; ARGV: token, key ttl ms. Stamps the start with the time now.
_STAMP_START = (
    NOW_US
    + """
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)


class LimitReached(ControlFlow):
    """The queue's global concurrency or rate limit is reached; try again later."""

    code = "limit_reached"

    def __init__(
        self, wait_s: float, reason: str, *, after_park: Callable[[], None] | None = None
    ) -> None:
        super().__init__(f"{reason} limit reached; try again in {wait_s:.2f}s")
        self.wait_s = wait_s
        self.reason = reason
        # Run once the job is parked (a key's line wakes its first job if a slot freed
        # while this one was being parked: the releaser could not promote it yet).
        self.after_park = after_park


@dataclass(frozen=True)
class Token:
    """One member of a limit's sorted set."""

    key: str
    member: str


@dataclass
class Admission:
    """What one delivery took from the limits it is under: concurrency slots (its queue's,
    its key's) and reserved starts, and what to do once it gives them back."""

    slots: list[Token] = field(default_factory=list)
    starts: list[tuple[Token, int]] = field(default_factory=list)  # and its key's ttl in ms
    started: bool = False
    # Run once its slots are given back (``tasks.jobs.run.key_limits`` wakes the next job).
    after_release: list[Callable[[], None]] = field(default_factory=list)


def configured() -> dict[str, QueueLimit]:
    """The queues' default limits (``KEEL_QUEUE_LIMITS``, parsed when the settings were read);
    ``limit_of`` is what is in force."""
    return get_settings().queue_limits


def limit_of(queue: str) -> QueueLimit | None:
    """``queue``'s limits in force: its default, or what was set live (``live_limits``)."""
    return live_limits.effective(queue)


def admit(queue: str) -> Admission:
    """Take what one job start on ``queue`` needs: a concurrency slot, then a start.

    The slot comes first because it is cheap to give back; a reserved start
    given back is a token another job could have used meanwhile.
    """
    admission = Admission()
    limit = limit_of(queue)
    if limit is None:
        return admission
    if limit.concurrency:
        admission.slots.append(_take_slot(queue, limit.concurrency))
    if limit.rate is not None:
        try:
            admission.starts.append(
                reserve_start(starts_key(queue), limit.rate.max, limit.rate.duration_ms, queue)
            )
        except LimitReached:
            release(admission)
            raise
    return admission


def started(admission: Admission) -> None:
    """The job was claimed: stamp its reserved start with the time now (after the claim)."""
    admission.started = True
    for start, ttl_ms in admission.starts:
        try:
            redis_client().eval(_STAMP_START, 1, start.key, start.member, ttl_ms)
        except Exception:  # the reservation stays, counting for longer than needed: safe
            log.warning("could not stamp a start on %s", start.key, exc_info=True)


def release(admission: Admission) -> None:
    """The run is over: free the slot; withdraw the start if the job never started.

    Best effort: an unreleased slot lapses with its lease, a reservation
    once its time has passed by a window.
    """
    for slot in admission.slots:
        _leases.untrack(slot)
        _remove(slot)
    if not admission.started:
        for start, _ttl_ms in admission.starts:
            _remove(start)
    for then in admission.after_release:
        try:
            then()
        except Exception:  # a wake-up lost is a wait until the backstop: never a lost job
            log.warning("could not act after giving back a slot", exc_info=True)
    admission.after_release.clear()


def slot_key(queue: str) -> str:
    return f"{KEY_PREFIX}:{queue}:active"


def starts_key(queue: str) -> str:
    return f"{KEY_PREFIX}:{queue}:starts"


def _lease_ms() -> int:
    return int(get_settings().lock_duration_s * 1000)


def _remove(token: Token) -> None:
    try:
        redis_client().zrem(token.key, token.member)
    except Exception:
        log.warning("could not give back a token of %s", token.key, exc_info=True)


def _eval(what: str, queue: str, script: str, keys: list[str], *args: str | int | float) -> int:
    try:
        return int(redis_client().eval(script, len(keys), *keys, *args))
    except Exception:
        log.warning("could not check the %s limit of %s; holding", what, queue, exc_info=True)
        raise LimitReached(UNKNOWN_HOLD_S, what) from None


def _take_slot(queue: str, concurrency: int) -> Token:
    slot = Token(slot_key(queue), uuid.uuid4().hex)
    args = (slot.member, concurrency, _lease_ms())
    taken = _eval("concurrency", queue, _TAKE_SLOT, [slot.key], *args)
    if not taken:
        raise LimitReached(
            random.uniform(CONCURRENCY_HOLD_S, 2 * CONCURRENCY_HOLD_S), "concurrency"
        )
    _leases.track(slot)
    return slot


def reserve_start(key: str, max_starts: int, duration_ms: int, limited: str) -> tuple[Token, int]:
    """A start reserved in the window ``key`` (``max_starts`` per ``duration_ms``) and the ttl
    its key needs; ``LimitReached`` if the window is full (``limited`` names it in the log)."""
    start = Token(key, uuid.uuid4().hex)
    reserve_ms = max(_lease_ms(), duration_ms)  # outlasts any claim, however slow
    keys = [key, blocked_key(key)]
    wait_us = _eval(
        "rate", limited, _RESERVE_START, keys, start.member, max_starts, duration_ms, reserve_ms
    )
    if wait_us < 0:  # blocked: ask again once it ends, spread over a quarter second
        raise LimitReached(-wait_us / 1e6 + random.uniform(0, BLOCK_SPREAD_S), "rate")
    if wait_us:
        # Ask again somewhere in the window after the oldest start leaves it,
        # so held jobs spread out instead of all asking at the same instant.
        wait_s = wait_us / 1e6 + random.uniform(0, duration_ms / 1000)
        raise LimitReached(wait_s, "rate")
    return start, duration_ms + reserve_ms


def blocked_key(starts: str) -> str:
    """Where a rate window (``starts``) keeps the time a handler blocked it until."""
    return f"{starts}:blocked"


def block(starts: str, ms: int) -> None:
    """Start no job under the rate window ``starts`` for ``ms`` (``RateLimited``)."""
    redis_client().eval(_BLOCK, 1, blocked_key(starts), ms)


def hold_until(admission: Admission, until: float | None) -> None:
    """Renew the admission's slots only until ``until`` (``time.monotonic()``): a run past
    its hard time limit that the pool cannot stop (threads, solo) gives its slots up with
    its lock, so that its job, run again elsewhere, and the others of its key or queue are
    not held by it."""
    if until is None:
        return
    for slot in admission.slots:
        _leases.hold_until(slot, until)


def lease_ms() -> int:
    """How long a slot is held without renewal (``KEEL_LOCK_DURATION_S``)."""
    return _lease_ms()


def track(slot: Token) -> None:
    """Renew ``slot``'s lease while this process holds it (``release`` stops it)."""
    _leases.track(slot)


class _Leases:
    """Renews the leases of the slots this process holds, every third of a lease."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._until: dict[str, float] = {}  # monotonic time past which a slot lapses
        self._guard = threading.Lock()
        self._thread_pid: int | None = None

    def track(self, slot: Token) -> None:
        with self._guard:
            self._held[slot.member] = slot.key
            self._until.pop(slot.member, None)
            if self._thread_pid != os.getpid():  # the first slot of this (forked) process
                self._thread_pid = os.getpid()
                renewer = threading.Thread(target=self._renew_forever, name="keel-leases")
                renewer.daemon = True
                renewer.start()

    def untrack(self, slot: Token) -> None:
        with self._guard:
            self._held.pop(slot.member, None)
            self._until.pop(slot.member, None)

    def hold_until(self, slot: Token, until: float) -> None:
        with self._guard:
            if slot.member in self._held:
                self._until[slot.member] = until

    def _renew_forever(self) -> None:
        stop = threading.Event()
        while not stop.wait(_lease_ms() / 3000):
            now = time.monotonic()
            with self._guard:
                held = [
                    (member, key)
                    for member, key in self._held.items()
                    if self._until.get(member, now) >= now
                ]
            if not held:
                continue
            members = [member for member, _ in held]
            keys = [key for _, key in held]
            try:
                redis_client().eval(_RENEW_SLOTS, len(keys), *keys, _lease_ms(), *members)
            except Exception:
                log.warning("could not renew concurrency slots", exc_info=True)


_leases = _Leases()
