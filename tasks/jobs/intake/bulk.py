"""Bulk: many jobs added at once (BullMQ's ``addBulk``).

One statement records them all, in one transaction with the tenant's quota
check (the whole batch fits, or nothing is added); their events go to Redis
in one pipeline. The waiting ones are published once that transaction has
committed, as a single ``add`` does (``tasks.jobs.intake.enqueue``): published
inside it, a message could reach a worker before its record was visible
there (the claim finds no row, the delivery is dropped, and the job waited
for the reconciler, up to ~25 s). Their messages go out in one Redis pipeline
(``tasks.jobs.intake.promote.publish_ready``, ``tasks.platform.pipelined``); a pipeline
that fails parks every job of it for the promoter, and a producer killed
between the commit and the
publish leaves waiting jobs without messages, which the reconciler
republishes (``tasks.jobs.upkeep.reconcile``). Jobs with a deduplication rule are
added one by one (``add``), since each takes its own claim.

Python's cyclic garbage collector is paused while a batch is built, recorded
and sent (``_collector_paused``): a batch of 10,000 keeps some 300,000 small
objects alive at once (records, messages, events), enough to set off full
collections that walk every object of the process, a fifth of a bulk add's
CPU. Refcounting frees the batch's objects, and the collector takes whatever
cycles are left once it runs again, as usual, when the batch is sent (the jobs with a
deduplication rule are added after it, one by one, with it on).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tasks.jobs.intake import caller_transaction, tenancy
from tasks.jobs.intake.celery_options import with_options
from tasks.jobs.intake.enqueue import AddedJob, add, check_data, new_job_id
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.models import State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import events
from tasks.jobs.store import jobs as store
from tasks.jobs.store.jobs import NewJob
from tasks.platform import tracing
from tasks.platform.db import transaction
from tasks.platform.setting_types import TenantLimits


@dataclass(frozen=True)
class BulkJob:
    """One job of a bulk add."""

    name: str
    data: dict[str, Any]
    queue: str
    opts: JobOptions = field(default_factory=JobOptions)
    ctx: dict[str, Any] | None = None


def add_bulk(
    jobs: Sequence[BulkJob], *, owner: Owner | None = None, limits: TenantLimits | None = None
) -> list[AddedJob]:
    """Add ``jobs`` for ``owner``; one ``AddedJob`` each, in order.

    ``TypeError`` if a job's data is not a dict; then none of them is recorded.
    """
    for i, job in enumerate(jobs):
        check_data(job.data, f"job {i}'s")
    single = {i for i, job in enumerate(jobs) if job.opts.deduplication is not None}
    with _collector_paused():
        records, created = _add_batch(
            [job for i, job in enumerate(jobs) if i not in single], owner, limits
        )
    added = iter(records)
    results: list[AddedJob] = []
    for i, job in enumerate(jobs):
        if i in single:
            results.append(
                add(
                    job.name,
                    job.data,
                    queue=job.queue,
                    opts=job.opts,
                    owner=owner,
                    limits=limits,
                    ctx=job.ctx,
                )
            )
            continue
        record, state = next(added)
        new = record.id in created
        results.append(AddedJob(record.id, new, str(state) if new else "existing"))
    return results


def _add_batch(
    jobs: Sequence[BulkJob], owner: Owner | None, limits: TenantLimits | None
) -> tuple[list[tuple[NewJob, State]], set[str]]:
    """Record ``jobs`` in one statement, then publish the waiting ones and send the events;
    the records with their states, and the ids of those that were new."""
    records = [
        NewJob(
            id=job.opts.job_id or new_job_id(),
            name=job.name,
            queue=job.queue,
            data=job.data,
            tenant_id=owner.tenant_id if owner else None,
            user_id=owner.user_id if owner else None,
            opts=job.opts,
            celery_ctx=tracing.carried(with_options(job.ctx, job.opts)),
            priority=tenancy.rank((job.ctx or {}).get("priority")),
        )
        for job in jobs
    ]
    if not records:
        return [], set()
    later = caller_transaction.deferred()  # ``in_transaction`` on another database
    if later is not None:
        later.defer(partial(_in_keels_transactions, records, owner, limits))
        return [(job, job.state) for job in records], {job.id for job in records}
    caller = caller_transaction.current()
    if caller is not None:
        return _in_callers_transaction(caller, records, owner, limits)
    return _in_keels_transactions(records, owner, limits)


def _in_keels_transactions(
    records: list[NewJob], owner: Owner | None, limits: TenantLimits | None
) -> tuple[list[tuple[NewJob, State]], set[str]]:
    """The batch recorded in one transaction of Keel's, its waiting jobs published in another."""
    with transaction() as session:
        _admit(session, owner, records, limits)
        created = store.insert_many(session, records)
    states = [(job, job.state) for job in records]  # a property: read once a job
    waiting = [job for job, state in states if state == State.WAITING and job.id in created]
    if waiting:  # after the commit: a worker that takes a message finds its record
        with transaction() as session:
            publish_ready(session, waiting)
    events.emit_many(
        [
            (job.queue, str(state), job.id, job.name, job.tenant_id)
            for job, state in states
            if job.id in created
        ]
    )
    return states, created


def _in_callers_transaction(
    caller: caller_transaction.CallerTransaction,
    records: list[NewJob],
    owner: Owner | None,
    limits: TenantLimits | None,
) -> tuple[list[tuple[NewJob, State]], set[str]]:
    """The batch recorded in the caller's transaction (``in_transaction``): the waiting jobs
    parked until it commits and published then, the others announced then; nothing of it
    if it rolls back. The tenant's quota is checked without its lock, as a single add's in
    a caller's transaction is (``enqueue``): the lock would be held until the caller
    commits."""
    with caller.statements() as session:
        _admit(session, owner, records, limits, lock=False)
        created = store.insert_many(session, records)
        states = [(job, job.state) for job in records]
        waiting = [job.id for job, state in states if state == State.WAITING and job.id in created]
        caller.hold_many(waiting)  # published once the caller commits, with their events
    others = [
        (job.queue, str(state), job.id, job.name, job.tenant_id)
        for job, state in states
        if job.id in created and state != State.WAITING
    ]
    if others:
        caller.on_commit(partial(events.emit_many, others))
    return states, created


# Bulk adds of this process under way with the collector paused (``_collector_paused``).
_pausing = 0
_pausing_lock = threading.Lock()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic collector off for the block, if it was on (see the module's doc).

    Bulk adds in several threads at once: the last to end turns it back on. One that starts
    while a caller has turned it off leaves it off; a caller that turns it off while a bulk
    add is under way sees it back on when the add ends. A process forked meanwhile gets it
    back on at once (``_forked``)."""
    global _pausing
    with _pausing_lock:
        if _pausing == 0 and not gc.isenabled():
            paused = False
        else:
            paused = True
            _pausing += 1
            gc.disable()
    try:
        yield
    finally:
        if paused:
            with _pausing_lock:
                _pausing -= 1
                if _pausing == 0:
                    gc.enable()


def _forked() -> None:
    """In a child forked during a bulk add: no add is under way here, the collector runs."""
    global _pausing, _pausing_lock
    _pausing_lock = threading.Lock()
    if _pausing:
        _pausing = 0
        gc.enable()


os.register_at_fork(after_in_child=_forked)


def _admit(
    session: Any,
    owner: Owner | None,
    records: Sequence[NewJob],
    limits: TenantLimits | None,
    *,
    lock: bool = True,
) -> None:
    """The tenant's quotas for the whole batch: every delay within bounds, the live count too."""
    if owner is None or limits is None:
        return
    if any(job.opts.delay > limits.max_delay_ms for job in records):
        raise tenancy.delay_too_long(limits)
    if lock:
        tenancy.lock(session, owner.tenant_id, "jobs")
    live = tenancy.load(session, owner.tenant_id, records[0].queue).live  # every queue's
    if live + len(records) > limits.live_jobs:
        raise tenancy.exceeded(
            "liveJobs",
            limits.live_jobs,
            live,
            f"the tenant has {live} live jobs; {len(records)} more would pass its quota "
            f"of {limits.live_jobs}",
        )
