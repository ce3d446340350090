"""Enqueue: commit the job's record, then publish its message.

The order is the guarantee: a job the caller was told about is always in
the records. If publishing fails after the commit (broker down or hung), the
job is parked as due-now in the durable delayed set, and a worker's promoter
publishes it once the broker is back — accepted work is never lost.

Publishing is bounded so that a hung broker cannot hold the API: the
broker's socket timeout (``tasks.celeryconfig``; on RabbitMQ the confirm
timeout, ``tasks.platform.rabbitmq``) bounds one attempt, there is no retry after a
timeout (a retry against a hung server only doubles the wait; a stale
connection is retried at once, ``tasks.platform.broker.publish``), and while the
broker is known to be unreachable the job is parked without trying.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

from tasks.jobs.intake import caller_transaction, tenancy
from tasks.jobs.intake.celery_options import with_options
from tasks.jobs.intake.messages import Message, publish, publish_all
from tasks.jobs.model.models import State
from tasks.jobs.model.options import Deduplication, JobOptions
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import events
from tasks.jobs.store import canvas as canvas_store
from tasks.jobs.store import dedup, upkeep
from tasks.jobs.store import jobs as store
from tasks.jobs.store.jobs import NewJob, ReadyJob
from tasks.platform import broker, deadline, tracing
from tasks.platform.celery_app import app
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.platform.setting_types import TenantLimits
from tasks.platform.transport import riding

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AddedJob:
    """What ``add`` did: the job's id, whether it made a new job (not a duplicate), its state."""

    job_id: str
    created: bool
    state: str


def new_job_id() -> str:
    """Opaque and unguessable: 128 random bits, as 32 hex digits."""
    return os.urandom(16).hex()


def check_data(data: object, whose: str = "a job's") -> None:
    """A job's data is a JSON object: a dict (or a subclass). ``TypeError`` otherwise, before
    anything is recorded (the API and the CLI answer ``validation_failed`` first)."""
    if not isinstance(data, dict):
        raise TypeError(f"{whose} data must be a dict (a JSON object), not {type(data).__name__}")


def park_for_republish(job_ids: list[str], in_s: float = 1.0) -> None:
    """A job whose message could not be published goes back to the durable delayed set."""
    with transaction() as session:
        upkeep.park(session, job_ids, in_s)


def add(
    name: str,
    data: dict[str, Any],
    *,
    queue: str,
    opts: JobOptions | None = None,
    owner: Owner | None = None,
    publish_now: bool = True,
    limits: TenantLimits | None = None,
    ctx: dict[str, Any] | None = None,
    parent: str | None = None,
) -> AddedJob:
    """Add a job. A duplicate (live dedup id, or an existing ``jobId``) adds nothing.

    ``publish_now=False`` records the job for a caller that publishes it
    itself, e.g. as part of a Celery chord. ``limits`` (with an ``owner``)
    applies the tenant's quota: what tenant-facing doors pass, so that
    ``QuotaExceeded`` refuses the add and nothing is recorded. ``ctx`` is the
    Celery canvas context (``publish``) recorded with the job. ``parent``: the id of
    the running job adding it as its child (``JobContext.add_child``), which a
    ``Defer(..., waiting_children=True)`` then waits for.

    Traced (``tasks.platform.tracing``), the add is a ``keel.add`` span, and its context is kept on
    the record, for every later publish of the job to join.

    ``TypeError`` if ``data`` is not a dict (``check_data``); nothing is recorded.
    """
    check_data(data)
    if not tracing.on():
        return _add(name, data, queue, opts, owner, publish_now, limits, ctx, parent)
    attributes = {"keel.job.name": name, "messaging.destination.name": queue}
    with tracing.span("keel.add", attributes) as span:
        carried = tracing.carried(ctx)
        added = _add(name, data, queue, opts, owner, publish_now, limits, carried, parent)
        span.set_attribute("keel.job.id", added.job_id)
        span.set_attribute("keel.job.added", added.state)
        return added


@dataclass
class _Recorded:
    """What recording one new job did: made it (``created``), or found the live job its
    dedup id names (``kept``), replacing another (``replaced``); its publish priority."""

    created: bool = False
    kept: str | None = None
    replaced: str | None = None
    priority: int = 0


def _add(
    name: str,
    data: dict[str, Any],
    queue: str,
    opts: JobOptions | None,
    owner: Owner | None,
    publish_now: bool,
    limits: TenantLimits | None,
    ctx: dict[str, Any] | None,
    parent: str | None = None,
) -> AddedJob:
    """Record the job (``_record``), then say so and publish it (``_announce``)."""
    opts = opts or JobOptions()
    ctx = with_options(ctx, opts)
    job = NewJob(
        id=opts.job_id or new_job_id(),
        name=name,
        queue=queue,
        data=data,
        tenant_id=owner.tenant_id if owner else None,
        user_id=owner.user_id if owner else None,
        opts=opts,
        celery_ctx=ctx or None,
        priority=tenancy.rank((ctx or {}).get("priority")),
        parent_job_id=parent,
    )
    later = caller_transaction.deferred()  # ``in_transaction`` on another database
    if later is not None:
        later.defer(partial(_record_and_announce, job, limits, publish_now, None))
        return AddedJob(job.id, True, str(job.state))  # (what it will be, if made then)
    caller = caller_transaction.current()  # ``in_transaction``: the caller's session records it
    return _record_and_announce(job, limits, publish_now, caller)


def _record_and_announce(
    job: NewJob, limits: TenantLimits | None, publish_now: bool, caller: Any
) -> AddedJob:
    return _announce(job, _record(job, limits, publish_now, caller), publish_now, caller)


def _record(job: NewJob, limits: TenantLimits | None, publish_now: bool, caller: Any) -> _Recorded:
    """Unless a debounce rule touches the held job, a chord counts its part or the caller's
    transaction records it, the add is one statement on its own (no BEGIN/COMMIT, no
    Session), its dedup claim and quota check included."""
    rule = job.opts.deduplication
    debounce = rule is not None and (rule.extend or rule.replace)
    body_id = canvas_store.chord_body_id(job.celery_ctx)
    if body_id is not None or debounce or caller is not None:
        return _record_in_session(job, limits, publish_now, caller, body_id)
    if rule is not None or limits is not None:
        admitted = tenancy.admit(job, limits, rule)
        on_queue = admitted.on_queue
        return _Recorded(admitted.created, admitted.kept, None, tenancy.priority_for(on_queue))
    if publish_now and job.state == State.WAITING:
        created, on_queue = store.insert_counting_alone(job, tenancy.LOAD_STEPS[-1])
        return _Recorded(created, priority=tenancy.priority_for(on_queue))
    return _Recorded(store.insert_alone(job))


def _record_in_session(
    job: NewJob, limits: TenantLimits | None, publish_now: bool, caller: Any, body_id: str | None
) -> _Recorded:
    """The add in a transaction: Keel's own, or the caller's (``in_transaction``)."""
    rule = job.opts.deduplication
    recorded = _Recorded()
    with caller.statements() if caller is not None else transaction() as session:
        # A tenant's quota lock goes with its dedup claim: one round trip for both. Not in
        # a caller's transaction: its lock would be held until the caller commits, and
        # every add of the tenant (the caller's own next one, on Keel's connection,
        # included) would wait for that. There the quota is checked from the caller's
        # snapshot, unlocked (concurrent transactions may overshoot it by their number).
        quota_lock = None
        if rule is not None and limits is not None and job.tenant_id is not None:
            quota_lock = tenancy.lock_key(job.tenant_id, "jobs") if caller is None else None
        if rule is not None:
            recorded.kept, recorded.replaced = _deduplicate(
                session, job.queue, rule, job.id, quota_lock
            )
        if recorded.kept is None and limits is not None:
            unlocked = caller is not None  # (as if taken: ``admit_insert`` skips it)
            load = tenancy.admit_insert(
                session, job, limits, locked=quota_lock is not None or unlocked
            )
            recorded.created = load is not None
            recorded.priority = tenancy.priority_for(load.on_queue if load else 0)
        elif recorded.kept is None and caller is not None:
            recorded.created = store.insert(session, job)
        elif recorded.kept is None and publish_now and job.state == State.WAITING:
            created, on_queue = store.insert_counting(session, job, tenancy.LOAD_STEPS[-1])
            recorded.created, recorded.priority = created, tenancy.priority_for(on_queue)
        elif recorded.kept is None:
            recorded.created = store.insert(session, job)
        if caller is not None and recorded.created and publish_now and job.state == State.WAITING:
            caller.hold(job.id)  # published once the caller commits
        if body_id is not None and not recorded.created:  # a chord part counts the job it names
            canvas_store.bind_part(session, body_id, job.id, recorded.kept or job.id)
    return recorded


def _announce(job: NewJob, recorded: _Recorded, publish_now: bool, caller: Any) -> AddedJob:
    """Events for what the add did, and the new job's publish: now, or in a caller's
    transaction once it commits (never if it rolls back)."""
    rule = job.opts.deduplication
    dedup_id = rule.id if rule else None

    def announce(send: Callable[[], object]) -> None:
        if caller is not None:
            caller.on_commit(send)
        else:
            send()

    if recorded.kept is not None:
        announce(
            partial(
                events.emit,
                job.queue,
                "deduplicated",
                recorded.kept,
                job.name,
                deduplicationId=dedup_id,
                deduplicatedJobId=job.id,
                tenant=job.tenant_id,
            )
        )
        return AddedJob(job_id=recorded.kept, created=False, state="deduplicated")
    if not recorded.created:
        return AddedJob(job_id=job.id, created=False, state="existing")
    if recorded.replaced is not None:
        announce(
            partial(
                events.emit,
                job.queue,
                "deduplicated",
                job.id,
                job.name,
                deduplicationId=dedup_id,
                deduplicatedJobId=recorded.replaced,
                tenant=job.tenant_id,
            )
        )
    delay: dict[str, Any] = {"delay": job.opts.delay} if job.opts.delay else {}
    added = events.Event.of(job, job.state, **delay)
    if caller is not None:  # nothing is announced before the caller's commit
        if not (publish_now and job.state == State.WAITING):  # (a held job's is, when sent)
            caller.on_commit(added.send)
        return AddedJob(job_id=job.id, created=True, state=job.state)
    if job.state == State.WAITING and publish_now:
        publish_or_park(
            job.id,
            job.name,
            job.queue,
            job.data,
            job.celery_ctx,
            priority=recorded.priority,
            event=added,
            tenant=job.tenant_id,
        )
    else:
        added.send()
    return AddedJob(job_id=job.id, created=True, state=job.state)


def _deduplicate(
    session: Session, queue: str, rule: Deduplication, job_id: str, lock_key: str | None = None
) -> tuple[str | None, str | None]:
    """``(kept, replaced)``: the live job that absorbs this add, or the one this add replaces
    (``lock_key``: an advisory lock the claim takes first, in its statement)."""
    held = dedup.claim(session, queue, rule, job_id, lock_key)
    if held is None:
        return None, None
    if rule.extend and rule.ttl:
        dedup.extend(session, queue, rule)
    if rule.replace and store.delete_delayed(session, held.job_id):
        dedup.hand_over(session, queue, rule, job_id)
        return None, held.job_id
    return held.job_id, None


def republish(jobs: Sequence[ReadyJob]) -> None:
    """Publish waiting jobs again (their message was lost), each behind its party's load as
    an add's message would be (``tenancy``); one the broker will not take is parked."""
    if not jobs:
        return
    with transaction() as session:
        ranked = [(j.id, j.tenant_id, j.queue, j.priority) for j in jobs]
        priority = tenancy.priorities(session, ranked)
    for job in jobs:
        publish_or_park(
            job.id,
            job.name,
            job.queue,
            job.data,
            job.celery_ctx,
            priority=priority.get(job.id, 0),
            tenant=job.tenant_id,
        )


def publish_or_park(
    job_id: str,
    name: str,
    queue: str,
    data: dict[str, Any],
    ctx: dict[str, Any] | None = None,
    *,
    priority: int = 0,
    event: events.Event | None = None,
    tenant: str | None = None,
) -> None:
    """Publish a waiting job; if the broker is down or hung, park it for the promoter.

    ``event`` (the job's ``waiting``) goes out with the message, in the same Redis
    round trip (``tasks.platform.transport.riding``), else on its own before the job is parked.
    """
    if broker.publish_unreachable():
        log.info("broker unreachable; job %s parked for republish", job_id)
        if event is not None:
            event.send()
        park_for_republish([job_id])
        return
    # Waiting on the broker is not database time: a request's budget (tasks.platform.deadline)
    # stands
    # still meanwhile, so a hung broker leaves the park below the whole of it.
    with deadline.paused():
        failed = _publish(job_id, name, queue, data, ctx, priority, event, tenant)
    if failed is not None:
        log.warning("broker unavailable; job %s parked for republish: %s", job_id, failed)
        park_for_republish([job_id])


def _publish(
    job_id: str,
    name: str,
    queue: str,
    data: dict[str, Any],
    ctx: dict[str, Any] | None,
    priority: int,
    event: events.Event | None,
    tenant: str | None,
) -> Exception | None:
    """Publish the job's message, and send its event; what failed the publish, if it did."""
    if event is not None and get_settings().broker_on_amqp:
        event.send()  # before the message, which a worker may take at once
        event = None
    started = time.monotonic()
    failed: Exception | None = None
    with riding(event.add_to) if event is not None else nullcontext(_nothing) as rode:
        try:
            # On Redis, the message and its task-sent event go in one pipeline, and the
            # job's event rides in it too: one round trip in all.
            with app.producer_or_acquire() as producer:
                message = Message(job_id, name, queue, data, ctx, priority=priority, tenant=tenant)
                if not publish_all(producer, [message]):
                    publish(message, producer)
        except Exception as exc:  # the record is safe; the promoter publishes it later
            failed = exc
    if failed is not None:  # first: an event sent next is dropped at once if Redis hangs
        broker.publish_failed(failed, getattr(failed, "started", started))
    if event is not None and (failed is not None or not rode()):
        event.send()  # its pipeline failed, or never went out
    return failed


def _nothing() -> bool:
    return True
