"""A tenant's share of the job system: its live-job quota and its place on shared queues.

**Quota.** A job added on a tenant's behalf through a tenant-facing door (the
API, a tenant's scheduler) is refused with ``QuotaExceeded`` once the tenant
has ``live_jobs`` jobs waiting, delayed or active. The count and the insert
happen under a per-tenant transaction lock, so concurrent requests cannot
overshoot it; another tenant's adds never wait on that lock.

**Fairness.** Queues are shared, and a broker queue is first in, first out:
a tenant that posts a hundred reports would make the next tenant wait behind
all of them. Keel publishes every job with a priority that falls as its
party's load on that queue grows — the jobs of the same tenant (or, for jobs
without an owner, of the system) already running or waiting there — using
kombu's Redis priority lists, served lowest number first across all the
queues a worker consumes: the job of a party with nothing on the queue goes
to the front, a party's hundredth job to the back. Within one priority,
order is still first in, first out, so each party's own jobs keep their
order. A single job of an idle tenant therefore waits at most for one
running job to finish, whatever another tenant — or a burst of system jobs —
has queued.

**A call's priority** (``priority=``, as ``rank``) reorders a party's own jobs:
the load that places a job counts only its party's jobs that rank at or
before it, so an urgent call behind a backfill gets the place the party's
first job would get. Each rank has its own count: a party whose waiting jobs
use n ranks can hold up to n jobs in the front list. Priorities come from
the application's code (the HTTP API takes none), not from tenants.

**On RabbitMQ** (``KEEL_BROKER_URL``) the queues are quorum queues, and
AMQP counts priority the other way (higher first): a job is published with
``9 - priority`` (``broker_priority``). What the broker does with it depends
on its version. RabbitMQ 3.x quorum queues ignore priorities: each queue is
first in, first out, and an idle tenant's job waits behind what other
tenants queued before it — the quota still bounds how much that is.
RabbitMQ 4 quorum queues have two levels (above 4: high): an idle or nearly
idle party's jobs (priorities 0 and 3) are high, the rest normal, and the
broker delivers about two high for each normal one when both wait.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.model.errors import LimitExceeded, QuotaExceeded
from tasks.jobs.model.options import Deduplication
from tasks.jobs.store import admission
from tasks.jobs.store import jobs as store
from tasks.jobs.store.jobs import NewJob
from tasks.platform.config import get_settings
from tasks.platform.setting_types import TenantLimits

# kombu's Redis priority lists (``priority_steps``); 0 is served first.
PRIORITY_STEPS = (0, 3, 6, 9)
# A job's rank among its party's jobs on a queue (a call's ``priority=``): 0 first.
RANKS = tuple(range(10))
# A job whose tenant has no job running or waiting on its queue gets priority 0,
# fewer than 4 gets 3, fewer than 16 gets 6, else 9.
LOAD_STEPS = (1, 4, 16)


@dataclass(frozen=True)
class TenantLoad:
    """A party's live jobs (all queues) and its jobs running or waiting on one queue."""

    live: int
    on_queue: int


def priority_for(on_queue: int) -> int:
    """The broker priority of a job whose party has ``on_queue`` jobs running or waiting."""
    for step, bound in zip(PRIORITY_STEPS, LOAD_STEPS, strict=False):
        if on_queue < bound:
            return step
    return PRIORITY_STEPS[-1]


def rank(priority: Any, *, on_amqp: bool | None = None) -> int:
    """A call's ``priority=`` as the job's rank among its party's jobs on its queue, 0 first.

    Celery hands a message's priority to the broker, and each broker keeps its own
    direction: Redis serves 0 first (and a message without one is 0: first), RabbitMQ the
    highest first (without one: 0, last). Keel keeps the direction of the configured
    broker, so a project's calls mean what they meant, over Keel's 0 to 9. ``None``: the
    call gave none. ``ValueError`` for anything but a whole number. ``on_amqp``: the
    broker's kind (default: the configured broker's).
    """
    if on_amqp is None:
        on_amqp = get_settings().broker_on_amqp
    if priority is None:
        return RANKS[-1] if on_amqp else RANKS[0]
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be a whole number from 0 to 9, not {priority!r}")
    given = min(max(priority, RANKS[0]), RANKS[-1])
    return RANKS[-1] - given if on_amqp else given


def broker_priority(priority: int) -> int:
    """The message priority that means ``priority`` to the configured broker.

    kombu's Redis lists serve 0 first; AMQP serves the highest first.
    """
    return PRIORITY_STEPS[-1] - priority if get_settings().broker_on_amqp else priority


def load(session: Session, tenant_id: str | None, queue: str, rank_: int = 0) -> TenantLoad:
    """A tenant's load (``None``: the system's jobs, those without an owner): its live jobs,
    and those running or waiting on ``queue`` at or before ``rank_``."""
    live, on_queue = store.party_load(session, tenant_id, queue, rank_)
    return TenantLoad(live, on_queue)


def lock_key(tenant_id: str, what: str) -> str:
    """The advisory lock that serialises a tenant's quota checks of kind ``what``."""
    return f"keel:quota:{what}:{tenant_id}"


def lock(session: Session, tenant_id: str, what: str) -> None:
    """Serialise this tenant's quota checks of kind ``what`` until the transaction ends."""
    session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
        {"key": lock_key(tenant_id, what)},
    )


def exceeded(limit: str, maximum: int, current: int, message: str) -> QuotaExceeded:
    details: list[dict[str, Any]] = [{"limit": limit, "max": maximum, "current": current}]
    return QuotaExceeded(message, details=details)


def delay_too_long(limits: TenantLimits) -> LimitExceeded:
    most = limits.max_delay_ms // 1000
    return LimitExceeded(
        f"a job may be delayed at most {most} s",
        details=[{"limit": "maxDelaySeconds", "max": most}],
    )


def admit_insert(
    session: Session, job: NewJob, limits: TenantLimits | None, *, locked: bool = False
) -> TenantLoad | None:
    """Check ``limits`` for one more job of the tenant and record ``job`` if they allow.

    The tenant's quota lock first; then one statement counts the party's live jobs (from
    a snapshot taken after the lock, so concurrent adds cannot overshoot) and records the
    job if the quota allows. Jobs without an owner (``tenant_id`` None) are the system's:
    no quota, a load all the same (for the priority). ``None``: a job with its id exists
    (nothing recorded); ``QuotaExceeded`` when the tenant is at its quota. ``locked``: the
    caller took the quota lock in this transaction already (with its dedup claim).
    """
    limits = _applying(job, limits)
    if limits is not None and not locked:
        lock(session, str(job.tenant_id), "jobs")
    maximum = limits.live_jobs if limits is not None else None
    created, live, on_queue = store.insert_within(session, job, maximum)
    if limits is not None and live >= limits.live_jobs:
        raise _live_jobs_exceeded(limits, live)
    return TenantLoad(live, on_queue) if created else None


def admit(
    job: NewJob, limits: TenantLimits | None, dedup: Deduplication | None
) -> admission.Admitted:
    """Claim ``dedup`` (simple or throttle), check ``limits`` and record ``job``: one statement
    on its own (``admission.admit``).

    ``QuotaExceeded`` when the tenant is at its live-jobs quota (nothing recorded, the
    claim included); ``LimitExceeded`` for a delay past its bound, checked first (an add
    that asks for it is refused whether or not its dedup id is held). Jobs without an owner
    are the system's: no quota.
    """
    limits = _applying(job, limits)
    try:
        return admission.admit(
            job,
            lock_key=lock_key(str(job.tenant_id), "jobs") if limits is not None else None,
            dedup=dedup,
            max_live=limits.live_jobs if limits is not None else None,
            up_to=LOAD_STEPS[-1],
        )
    except admission.OverQuota as over:
        assert limits is not None  # raised only against a quota
        raise _live_jobs_exceeded(limits, over.live) from None


def _applying(job: NewJob, limits: TenantLimits | None) -> TenantLimits | None:
    """The limits that hold for ``job`` (none for the system's jobs), its delay checked."""
    if job.tenant_id is None or limits is None:
        return None
    if job.opts.delay > limits.max_delay_ms:
        raise delay_too_long(limits)
    return limits


def _live_jobs_exceeded(limits: TenantLimits, live: int) -> QuotaExceeded:
    return exceeded(
        "liveJobs",
        limits.live_jobs,
        live,
        f"the tenant has {live} live jobs, its quota is {limits.live_jobs}",
    )


def _at_or_before(ranks: Counter[int], rank_: int) -> int:
    return sum(count for r, count in ranks.items() if r <= rank_)


def priorities(session: Session, jobs: list[tuple[str, str | None, str, int]]) -> dict[str, int]:
    """Priorities of jobs ``(id, tenant, queue, rank)`` that just became waiting in this
    transaction.

    Each is placed after what its party already has on its queue at or before its rank,
    in the given order, so a burst promoted at once (a hundred reports scheduled for
    the same minute) is spread over the priorities like a burst of adds.
    """
    # Ranks are counted per party (a batch has few ranks): counting, for every job, the
    # others of its party at or before its rank made a 10,000-job bulk add quadratic.
    in_batch: dict[tuple[str | None, str], Counter[int]] = {}
    for _, tenant, queue, rank_ in jobs:
        in_batch.setdefault((tenant, queue), Counter())[rank_] += 1
    ahead: dict[tuple[str | None, str, int], int] = {}
    for _, tenant, queue, rank_ in jobs:
        if (tenant, queue, rank_) not in ahead:
            counted = load(session, tenant, queue, rank_).on_queue
            # what was there before these became waiting (the count includes them)
            mine = _at_or_before(in_batch[(tenant, queue)], rank_)
            ahead[(tenant, queue, rank_)] = counted - mine
    placed: dict[tuple[str | None, str], Counter[int]] = {}
    found: dict[str, int] = {}
    # A party with one rank in the batch (a bulk add's usual case): every job of it placed
    # earlier is at or before the next, so counting them is enough.
    one_rank = {party: 0 for party, ranks in in_batch.items() if len(ranks) == 1}
    for job_id, tenant, queue, rank_ in jobs:
        party = (tenant, queue)
        if party in one_rank:
            earlier_count = one_rank[party]
            one_rank[party] = earlier_count + 1
            found[job_id] = priority_for(max(0, ahead[(tenant, queue, rank_)] + earlier_count))
            continue
        earlier = placed.setdefault(party, Counter())
        before = ahead[(tenant, queue, rank_)] + _at_or_before(earlier, rank_)
        found[job_id] = priority_for(max(0, before))
        earlier[rank_] += 1
    return found
