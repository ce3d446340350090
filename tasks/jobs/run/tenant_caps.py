"""A tenant's running jobs, capped across every worker: no tenant holds every slot, of a
queue or of all, and the system's own jobs always find one.

Fairness orders a shared queue's messages by tenant (``tasks.jobs.intake.tenancy``), but
a job that started runs to its end: with nothing more, a tenant whose jobs are long could
fill every worker's slots and make everyone else wait for them. So a tenant's job takes,
before its claim, these slots (all or none; given back together, with its admission):

1. with a ``systemReserve`` (none by default), one of every tenant's together, on its
   queue and on every queue (the *tenants' shares*): the slots of the live workers that
   consume its queue, and of all of them, less ``systemReserve`` (at least one slot is
   always the tenants'), so that a system job (which takes none of these) finds a slot
   free however busy the tenants are (taken last, below);
2. with a ``maxRunningPerQueue``, one of its tenant's on its queue (unset: none; a
   default of half the queue's slots held a tenant's stalled job, recovered by the other
   worker, behind that tenant's waiting ones);
3. one of its tenant's on every queue (``maxRunning``; unset, half of the tenants' share
   of every queue, rounded up).

Half of a share, so that another tenant finds a slot free too: a lone worker of 3 runs two
jobs of a tenant and one of another's; with ``systemReserve`` 1, a job of each of two
tenants and keeps one slot for the system, and one of 4 runs two jobs of a tenant and one of
another's, and keeps one.

A tenant's two are taken first, exactly as a key's ``queue`` strategy takes its slots
(``tasks.jobs.run.key_limits.take_slot``): leased on Redis's clock and renewed while they
run (a dead worker's slots free themselves within ``KEEL_LOCK_DURATION_S``), a job over a
cap parked without using an attempt, in its tenant's line, and published as soon as a
slot of that line frees, in the order it came. The tenants' shares are leased the same way
but have no line of their own (a line shared by every tenant would put one tenant's
backlog ahead of another's job): a job that finds a share full goes back to the front of
its tenant's lines and asks again within ``key_limits.KEY_HOLD_S`` (it is the one its
tenant runs next), and nothing of those lines is woken by the slots it gives back, held
for a moment only. A share freed by a tenant's job is taken at once by that tenant's next
job, and by another tenant's within that hold: with more tenants busy than the share holds
at their caps, who gets a freed slot of it is the first to ask, not the longest waiting.

With no worker known yet there is no default cap.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass

from tasks.jobs.model.key_limits import KeyConcurrency
from tasks.jobs.run import capacity, key_limits, limits
from tasks.jobs.run.key_limits import KeyNames, take_slot
from tasks.platform.broker import redis_client
from tasks.platform.quotas import current
from tasks.platform.setting_types import TenantQuotas

log = logging.getLogger(__name__)

TENANT_PREFIX = f"{limits.KEY_PREFIX}:tenant"
SHARE_KEY = f"{limits.KEY_PREFIX}:tenants:active"  # every tenant's running jobs together
SLOTS_TTL_S = 5.0  # how long a process trusts the live workers' slots it read
MOST = 10_000  # the largest cap a key's concurrency takes

_slots: dict[str, object] = {"seen": capacity.Slots(), "read_at": -math.inf}

# KEYS: the tenants' shares (holders: ARGV[5] of them), then each line the job left and its
# asks. ARGV: holder, job, lease ms, stale ms, how many shares, then each share's max. 1: a
# slot of each share is taken (share i's member: holder:i); 0: one is full, and the job is
# back at the front of the lines it left a moment ago (it was first in them).
_TAKE_SHARES = (
    limits.NOW_US
    + """
local lease, stale, shares = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local full = false
for i = 1, shares do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[5 + i]) then full = true end
end
if not full then
  for i = 1, shares do
    redis.call('ZADD', KEYS[i], now + lease * 1000, ARGV[1] .. ':' .. i)
    redis.call('PEXPIRE', KEYS[i], lease)
  end
  return 1
end
for i = shares + 1, #KEYS, 2 do
  local line, asked = KEYS[i], KEYS[i + 1]
  local first = redis.call('ZRANGE', line, 0, 0, 'WITHSCORES')
  local front = now
  if #first > 0 then front = math.min(now, tonumber(first[2]) - 1) end
  redis.call('ZADD', line, 'NX', front, ARGV[2])
  redis.call('ZADD', asked, now, ARGV[2])
  for _, key in ipairs({line, asked}) do redis.call('PEXPIRE', key, lease + stale) end
end
return 0
"""
)


@dataclass(frozen=True)
class Caps:
    """The caps in force for one queue's jobs; ``None``: none."""

    per_queue: int | None  # one tenant's running jobs on the queue
    tenant: int | None  # one tenant's, every queue
    tenants_on_queue: int | None  # every tenant's together on the queue
    tenants: int | None  # every tenant's together, every queue

    @classmethod
    def of(cls, quotas: TenantQuotas, slots: capacity.Slots, queue: str) -> Caps:
        """What ``quotas`` set, else the share of the live workers' ``slots`` each default is."""
        reserve = quotas.system_reserve
        on_queue = reserved(slots.of(queue), reserve)
        tenants = reserved(slots.total, reserve)
        return cls(
            per_queue=quotas.max_running_per_queue,
            tenant=quotas.max_running or half(tenants),
            # with nothing reserved, the tenants' shares are every slot: no job could exceed
            # them, so none is taken (their leases and their round trip saved)
            tenants_on_queue=on_queue if reserve else None,
            tenants=tenants if reserve else None,
        )


def half(share: int | None) -> int | None:
    """Half of the tenants' ``share``, rounded up: what one tenant runs by default, so that
    another tenant always finds a slot of the share (two slots or more) free."""
    return None if share is None else min(MOST, math.ceil(share / 2))


def reserved(slots: int, reserve: int) -> int | None:
    """The tenants' share of ``slots``: all but ``reserve`` of them, at least one; ``None`` for
    none (no worker known)."""
    return min(MOST, max(1, slots - reserve)) if slots > 0 else None


def names(tenant: str, queue: str | None = None) -> KeyNames:
    """The Redis keys of ``tenant``'s running slots and line, on every queue or on ``queue``
    (each id's length first, so that no two ids share them)."""
    base = f"{TENANT_PREFIX}:t{len(tenant)}.{tenant}"
    return KeyNames(base if queue is None else f"{base}:q{len(queue)}.{queue}")


def caps(queue: str) -> Caps:
    """The caps in force now on ``queue``'s jobs."""
    return Caps.of(current(), _live(), queue)


def _live() -> capacity.Slots:
    now = time.monotonic()
    read_at = _slots["read_at"]
    if not isinstance(read_at, float) or now - read_at >= SLOTS_TTL_S:
        try:
            _slots["seen"] = capacity.live(redis_client())
        except Exception:  # keep the last figures: caps read a while ago are still fair
            log.warning("could not read the live workers' slots", exc_info=True)
        _slots["read_at"] = now
    seen = _slots["seen"]
    return seen if isinstance(seen, capacity.Slots) else capacity.Slots()


def admit(admission: limits.Admission, tenant: str | None, queue: str, job_id: str) -> None:
    """Take ``tenant``'s running slots for ``job_id`` on ``queue`` into ``admission``; a
    system job (``tenant`` None) takes none. ``LimitReached``: the job waits in its
    tenant's line; the caller gives back what was taken (``limits.release``)."""
    if tenant is None:
        return
    now, lines = caps(queue), []
    before = len(admission.after_release)
    for line, most, what in (
        (names(tenant, queue), now.per_queue, f"tenant {tenant!r} on {queue}"),
        (names(tenant), now.tenant, f"tenant {tenant!r}"),
    ):
        if most is not None:
            take_slot(admission, line, KeyConcurrency("tenant", max_running=most), job_id, what)
            lines.append(line)
    shares = [
        (key, most)
        for key, most in ((share_key(queue), now.tenants_on_queue), (SHARE_KEY, now.tenants))
        if most is not None
    ]
    if shares and not _take_shares(admission, shares, lines, job_id):
        del admission.after_release[before:]  # nothing was freed for its lines' next jobs
        raise limits.LimitReached(key_limits.hold_s(0, 1), "tenants' share")


def share_key(queue: str) -> str:
    """Where every tenant's running jobs on ``queue`` hold their slots."""
    return f"{SHARE_KEY}:q{len(queue)}.{queue}"


def _take_shares(
    admission: limits.Admission,
    shares: list[tuple[str, int]],
    lines: list[KeyNames],
    job_id: str,
) -> bool:
    """A slot of each of the tenants' ``shares`` (key, max) into ``admission``; ``False``: one
    is full, and the job is back at the front of ``lines``, the ones whose slots it just took."""
    member = uuid.uuid4().hex
    keys = [key for key, _most in shares]
    keys += [key for line in lines for key in line.concurrency[1:]]
    stale_ms = int(key_limits.STALE_WAITER_S * 1000)
    args: list[str | int] = [member, job_id, limits.lease_ms(), stale_ms, len(shares)]
    args += [most for _key, most in shares]
    try:
        taken = int(redis_client().eval(_TAKE_SHARES, len(keys), *keys, *args))
    except Exception:
        log.warning("could not check the tenants' share; holding", exc_info=True)
        raise limits.LimitReached(limits.UNKNOWN_HOLD_S, "tenants' share") from None
    for i, (key, _most) in enumerate(shares if taken else (), start=1):
        slot = limits.Token(key, f"{member}:{i}")  # one member per slot: each lease its own
        admission.slots.append(slot)
        limits.track(slot)
    return bool(taken)
