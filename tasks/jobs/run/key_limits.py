"""Limits by key across every worker and host: concurrency per key with its strategy, and a
start rate per key (declared by the job type: ``tasks.jobs.model.key_limits``).

They live in Redis beside the queue limits (``tasks.jobs.run.limits``), read Redis's clock,
and are taken the same way, before the claim, so waiting costs no attempt:

- A key's running jobs hold slots in a sorted set scored by lease expiry, renewed while
  they run: a dead worker's slot frees itself within ``KEEL_LOCK_DURATION_S``.
- ``queue``: a job that finds its key full joins the key's line (a sorted set by first
  ask) and is parked in the durable delayed set. When a slot of its key is given back,
  the first in line is promoted and published at once; it also asks again at the latest
  ``KEY_HOLD_S`` later, so a lost wake-up costs a wait, never the job. A later job of the
  key never overtakes one in line; other keys' jobs are not held by it. A job in line not
  heard from for ``STALE_WAITER_S`` (cancelled, deleted) loses its place.
- ``cancel_in_progress``: a new job of the key supersedes the others: the running ones
  are aborted (``tasks.jobs.end.abort``), the ones in line cancelled; it runs when the
  aborted runs have given their slot back.
- ``cancel_newest``: a job that finds its key's job running is cancelled itself.
- A key rate is a moving window of starts, as a queue's rate is. A handler that raises
  ``RateLimited`` (the service it calls said "too many requests") holds its key's window,
  or its queue's, until the time it names (``rate_limited``).

A key is its tenant's: two tenants' jobs with the same key share nothing. A call can give
its job's concurrency key itself (the ``concurrencyKey`` option); it travels in the job's
messages, as the tenant does (``tasks.jobs.intake.messages``), so admission reads no
record. A job whose data has no value for the key is not limited by it.

What a job type declares can be overridden live, per tenant or key pattern, without a
restart (``live_key_limits``): each admission takes the ``max_running`` and rate in force
from that process's copy of the overrides, read again every second, never per job.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import Task
from sqlalchemy import text

from tasks.jobs.end import cancel
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.errors import ControlFlow, RateLimited, Refused
from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate, key_value
from tasks.jobs.model.models import State
from tasks.jobs.run import limits, live_key_limits
from tasks.jobs.store import upkeep
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction

log = logging.getLogger(__name__)

KEY_PREFIX = f"{limits.KEY_PREFIX}:key"
# A job in its key's line asks again at the latest this long after it was parked (plus up
# to a quarter more, spread): the backstop of the wake-up. One further back waits longer,
# a hold for each round of slots ahead of it, up to ``MAX_HOLD_S``: a long line is woken,
# not polled.
KEY_HOLD_S = 2.0
MAX_HOLD_S = 10.0
# A job in line that has not asked for this long is gone (cancelled, deleted): it loses
# its place, so that it does not hold its key's line for ever.
STALE_WAITER_S = 15.0  # more than MAX_HOLD_S and its spread: a held job keeps its place
CANCELLED_BY = "key"
# A key whose concurrency was lifted live wakes at most this many of its line at once.
MAX_WAKE = 10_000

# KEYS: holders, line, asked, newest. ARGV: holder, job, max, lease ms, stale ms, mode,
# the job's creation time (µs).
# mode 'queue': take a free slot unless as many jobs are ahead in line as there are free
# slots, else get in line; 'first' (cancel_newest): take a free slot or be refused (no
# line); 'newest' (cancel_in_progress): a job older than the newest the key has seen is
# refused; otherwise, not in line yet, it becomes the newest and supersedes every other
# job of the key first (a holder of its own id, a duplicate delivery, excepted).
# Returns {outcome, place, superseded...}: outcome 1 taken, 0 in line (place: how many are
# ahead of it), -1 refused; superseded entries are 'run:<holder>' and 'line:<job>'.
_TAKE = (
    limits.NOW_US
    + """
local holders, line, asked, newest = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job, max, lease = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local stale, mode, created = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local ttl = lease + stale
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', asked, '-inf', now - stale * 1000)) do
  redis.call('ZREM', line, gone)
  redis.call('ZREM', asked, gone)
end
local result = {0, 0}
if mode == 'newest' then
  if created < tonumber(redis.call('GET', newest) or '0') then
    result[1] = -1
    return result
  end
  if not redis.call('ZSCORE', line, job) then
    redis.call('SET', newest, string.format('%d', created), 'PX', ttl)
    local own = ':' .. job
    for _, holder in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
      if string.sub(holder, -#own) ~= own then table.insert(result, 'run:' .. holder) end
    end
    for _, waiting in ipairs(redis.call('ZRANGE', line, 0, -1)) do
      if waiting ~= job then table.insert(result, 'line:' .. waiting) end
    end
    redis.call('DEL', line, asked)
  end
end
local free = max - redis.call('ZCARD', holders)
local ahead = redis.call('ZRANK', line, job) or redis.call('ZCARD', line)
if free > 0 and ahead < free then
  redis.call('ZADD', holders, now + lease * 1000, ARGV[1])
  redis.call('ZREM', line, job)
  redis.call('ZREM', asked, job)
  redis.call('PEXPIRE', holders, ttl)
  result[1] = 1
  return result
end
if mode == 'first' then
  result[1] = -1
  return result
end
redis.call('ZADD', line, 'NX', now, job)
redis.call('ZADD', asked, now, job)
for _, key in ipairs({holders, line, asked}) do redis.call('PEXPIRE', key, ttl) end
result[2] = redis.call('ZRANK', line, job)
return result
"""
)

# KEYS: holders, line, asked. ARGV: max, stale ms. The first jobs in line that the free
# slots can take now (what to wake).
_NEXT = (
    limits.NOW_US
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local stale_us = tonumber(ARGV[2]) * 1000
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - stale_us)) do
  redis.call('ZREM', KEYS[2], gone)
  redis.call('ZREM', KEYS[3], gone)
end
local free = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[1])
if free <= 0 then return {} end
return redis.call('ZRANGE', KEYS[2], 0, free - 1)
"""
)

_RECORD = text(
    "SELECT state, (EXTRACT(EPOCH FROM created_at) * 1000000)::bigint AS created_us"
    " FROM jobs WHERE id = :id"
)
_ENDED = ("completed", "failed", "cancelled")
_LIVE = text(
    "SELECT id FROM jobs WHERE id = ANY(:ids) AND state NOT IN ('completed', 'failed', 'cancelled')"
)
# Lines cleared of ended jobs per wake-up, at most (each round one batch of heads).
_WAKE_ROUNDS = 5


class Superseded(ControlFlow):
    """A job of its key runs, and the key's strategy (``cancel_newest``) cancels the new one."""

    code = "superseded"


@dataclass(frozen=True)
class Given:
    """What a job's delivery says of its keys: its tenant, whose keys they are (``None``: a
    system job's), and the concurrency key its call gave (``concurrencyKey``), if any."""

    tenant: str | None = None
    concurrency_key: str | None = None


# A call's key for a job type that declares no key concurrency: one at a time, in line.
CALL_KEY_DEFAULT = KeyConcurrency("concurrencyKey")


@dataclass(frozen=True)
class KeyNames:
    """The Redis keys of one key of one job type, for one tenant."""

    base: str

    @classmethod
    def of(cls, name: str, tenant: str | None, key: str) -> KeyNames:
        # The tenant's length first: no tenant id and key can be read as another pair.
        scope = "-" if tenant is None else f"t{len(tenant)}.{tenant}"
        return cls(f"{KEY_PREFIX}:{name}:{scope}:{key}")

    @property
    def concurrency(self) -> tuple[str, str, str]:
        return f"{self.base}:active", f"{self.base}:line", f"{self.base}:asked"

    @property
    def newest(self) -> str:
        return f"{self.base}:newest"

    @property
    def starts(self) -> str:
        return f"{self.base}:starts"


def declared(task: Task) -> tuple[KeyConcurrency | None, KeyRate | None]:
    """The key limits ``task``'s job type declares (``key_concurrency``, ``key_rate``)."""
    return getattr(task, "key_concurrency", None), getattr(task, "key_rate", None)


def admit(
    admission: limits.Admission,
    task: Task,
    data: Mapping[str, Any],
    job_id: str,
    given: Given = Given(),
) -> None:
    """Take what a start of ``job_id`` needs from its key's limits, into ``admission``.

    ``LimitReached``: park it (its ``after_park`` then runs); ``Superseded``: cancel it.
    """
    concurrency, rate = declared(task)
    key = None
    if given.concurrency_key:  # the call's, whatever the data says
        concurrency = concurrency or CALL_KEY_DEFAULT
        key = given.concurrency_key
    elif concurrency is not None:
        key = _key(concurrency.key, data, task.name)
    if concurrency is not None and key is not None:
        _take_key_slot(admission, task.name, given.tenant, key, concurrency, job_id)
    if rate is not None:
        key = _key(rate.key, data, task.name)
        in_force = None if key is None else live_key_limits.rate(task.name, given.tenant, key, rate)
        if key is not None and in_force is not None:
            starts = KeyNames.of(task.name, given.tenant, key).starts
            limited = f"{task.name} key {key}"
            admission.starts.append(
                limits.reserve_start(starts, in_force.max, in_force.per_ms, limited)
            )


def _take_key_slot(
    admission: limits.Admission,
    name: str,
    tenant: str | None,
    key: str,
    declared: KeyConcurrency,
    job_id: str,
) -> None:
    """A slot of ``tenant``'s ``key`` by its concurrency in force (an override's, set live:
    ``live_key_limits``); its wake-up reads the limit in force again when the slot is given
    back, so that a limit raised meanwhile wakes as many as it now lets run."""
    spec = live_key_limits.concurrency(name, tenant, key, declared)
    if spec is None:
        return

    def max_now() -> int:
        now = live_key_limits.concurrency(name, tenant, key, declared)
        return now.max_running if now is not None else MAX_WAKE

    take_slot(admission, KeyNames.of(name, tenant, key), spec, job_id, f"key {key!r}", max_now)


def _key(source: Any, data: Mapping[str, Any], name: str) -> str | None:
    """The job's key; a key function that fails on the job's data gives it none (logged):
    the job runs unlimited rather than never."""
    try:
        return key_value(source, data)
    except Exception:
        log.warning("the key of a %s job could not be read: no key limit", name, exc_info=True)
        return None


def rate_limited(
    task: Task, data: Mapping[str, Any], queue: str, limited: RateLimited, given: Given = Given()
) -> bool:
    """A handler raised ``RateLimited``: hold its limiter's window until the time it named;
    ``False`` if there is no window to hold (only the job itself then waits)."""
    if limited.scope == "queue":
        limit = limits.limit_of(queue)
        if limit is None or limit.rate is None:
            return False
        limits.block(limits.starts_key(queue), limited.delay_ms)
        return True
    _concurrency, rate = declared(task)
    key = _key(rate.key, data, task.name) if rate is not None else None
    if key is None or rate is None:
        return False
    if live_key_limits.rate(task.name, given.tenant, key, rate) is None:
        return False  # its key's rate is lifted live: there is no window to hold
    limits.block(KeyNames.of(task.name, given.tenant, key).starts, limited.delay_ms)
    return True


def take_slot(
    admission: limits.Admission,
    names: KeyNames,
    spec: KeyConcurrency,
    job_id: str,
    what: str,
    max_now: Callable[[], int] | None = None,
) -> None:
    """A slot of ``names`` for ``job_id`` into ``admission``, or its place in the line
    (``LimitReached``) or its cancellation (``Superseded``), as ``spec``'s strategy says;
    ``what`` names the key in reasons. ``max_now``: the limit when a slot is given back
    (else ``spec``'s), for a limit that can change meanwhile."""
    created_us = 0
    if spec.strategy == "cancel_in_progress":
        found = _record(job_id)
        if found is not None and found[0] in _ENDED:
            return  # superseded already: its claim refuses it, and it must not supersede others
        # Its age decides, not who asks first: a retry of an older job supersedes nothing.
        created_us = found[1] if found is not None else int(time.time() * 1e6)
    holder = f"{uuid.uuid4().hex}:{job_id}"
    mode = {"queue": "queue", "cancel_in_progress": "newest", "cancel_newest": "first"}
    try:
        reply = redis_client().eval(
            _TAKE,
            4,
            *names.concurrency,
            names.newest,
            holder,
            job_id,
            spec.max_running,
            limits.lease_ms(),
            int(STALE_WAITER_S * 1000),
            mode[spec.strategy],
            created_us,
        )
    except Exception:
        log.warning("could not check the limit of %s; holding", names.base, exc_info=True)
        raise limits.LimitReached(limits.UNKNOWN_HOLD_S, f"{what} concurrency") from None
    outcome, place = int(reply[0]), int(reply[1])

    def wake() -> None:
        wake_next(names, max_now() if max_now is not None else spec.max_running)

    if outcome == 1:  # the slot is ours from here: given back with the admission
        slot = limits.Token(names.concurrency[0], holder)
        admission.slots.append(slot)
        limits.track(slot)
        admission.after_release.append(wake)
    superseded = [entry.decode() if isinstance(entry, bytes) else entry for entry in reply[2:]]
    if superseded:
        _supersede(superseded, job_id, what)
    if outcome == 1:
        return
    if outcome == -1 and spec.strategy == "cancel_in_progress":
        raise Superseded(f"a newer job of its {what} came: cancelled (cancel_in_progress)")
    if outcome == -1:
        raise Superseded(f"a job of its {what} is running: cancelled (cancel_newest)")
    raise limits.LimitReached(
        hold_s(place, spec.max_running), f"{what} concurrency", after_park=wake
    )


def hold_s(place: int, max_running: int) -> float:
    """How long a job ``place`` from the head of its line waits before it asks again, if no
    wake-up comes first: a hold per round of slots ahead of it, spread by up to a quarter."""
    rounds = 1 + place // max(1, max_running)
    return min(MAX_HOLD_S, KEY_HOLD_S * rounds) * random.uniform(1, 1.25)


def _record(job_id: str) -> tuple[str, int] | None:
    """The job's state and creation time (µs); ``None`` without a record (yet)."""
    with transaction() as session:
        row = session.execute(_RECORD, {"id": job_id}).first()
    return (str(row.state), int(row.created_us)) if row is not None else None


def _supersede(entries: list[str], newest: str, what: str) -> None:
    """``cancel_in_progress``: abort the key's running jobs, cancel the ones in line. Best
    effort: one that could not be stopped here runs on, its slot given back as it ends."""
    reason = f"superseded by job {newest} of {what} (cancel_in_progress)"
    in_line = [entry.split(":", 1)[1] for entry in entries if entry.startswith("line:")]
    running = [entry.split(":", 2)[2] for entry in entries if entry.startswith("run:")]
    try:
        if in_line:
            with transaction() as session:
                states = [State.DELAYED, State.WAITING]
                done = cancel.cancel_in(session, in_line, states, actor=CANCELLED_BY, reason=reason)
            cancel.announce(done, by=CANCELLED_BY)
        for job_id in running:
            try:
                cancel.cancel(job_id, None, actor=CANCELLED_BY, reason=reason, audit=True)
            except Refused:  # it ended meanwhile
                continue
    except Exception:
        log.warning("could not supersede the other jobs of %s", what, exc_info=True)


def wake_next(names: KeyNames, max_running: int) -> list[str]:
    """Promote and publish the first jobs in a key's line that its free slots can take.

    A job in line that has ended meanwhile (cancelled, deleted) leaves the line here, and
    the next one is taken instead: it would hold the line until it went stale.
    """
    line = names.concurrency
    woken: list[str] = []
    for _ in range(_WAKE_ROUNDS):
        found = redis_client().eval(_NEXT, 3, *line, max_running, int(STALE_WAITER_S * 1000))
        heads = [entry.decode() if isinstance(entry, bytes) else entry for entry in found]
        if not heads:
            break
        with transaction() as session:
            ready = upkeep.promote_now(session, heads)
            gone = _gone(session, [h for h in heads if h not in {job.id for job in ready}])
            woken += [job.id for job in publish_ready(session, ready)]
        if not gone:
            break
        redis_client().zrem(line[1], *gone)
        redis_client().zrem(line[2], *gone)
    return woken


def _gone(session: Any, job_ids: list[str]) -> list[str]:
    """Those of ``job_ids`` that have ended or have no record."""
    if not job_ids:
        return []
    live = session.execute(_LIVE, {"ids": job_ids}).scalars().all()
    return [job_id for job_id in job_ids if job_id not in set(live)]
