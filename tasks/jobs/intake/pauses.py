"""Paused queues: BullMQ's ``queue.pause()`` / ``resume()``, durable in Postgres.

A queue is paused for every tenant (the CLI's system scope: ``keel queues pause Q``) or for
one tenant's jobs on it (a tenant operator: ``POST /api/v1/queues/<queue>/pause``). While
it is:

- jobs are added as usual (recorded, and published) and wait;
- a worker that takes a message of a paused job does not claim it: it notes the job as
  held (``held_jobs``) and acknowledges the message. The job stays ``waiting``, with no
  attempt spent, and no message anywhere; the reconciler leaves held jobs alone;
- a delayed job that falls due is published, and held the same way;
- running jobs run to their end.

Each worker process reads the set of paused queues at most every ``CHECK_S`` (0.5 s) before
a claim, so a pause is honoured by every worker within a second, by one read of a tiny table
per process and half second while jobs arrive; only a job of a queue with a pause costs a
statement more (the hold, ``tasks.jobs.store.pauses``).

Lifting a pause (``resume``) publishes the jobs that pause held again, oldest held first,
in batches (up to ``RESUME_BATCHES`` of ``RELEASE_BATCH`` in the call itself). A worker's
maintenance also releases, every stalled-check interval, held jobs that no pause covers any
more: the rest of a bigger backlog, and what a process that died in the middle of a
``resume`` left.

Pauses and held jobs live in Postgres, so they outlast the restart of every process; a
worker started while a queue is paused holds its jobs like the others.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from tasks.jobs.intake import webhook_events
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.store import pauses as store
from tasks.jobs.store import runs
from tasks.jobs.store.pauses import ALL_TENANTS, Hold, Pause
from tasks.platform.db import transaction

log = logging.getLogger(__name__)

CHECK_S = 0.5
RELEASE_BATCH = 500
RESUME_BATCHES = 10  # what a resume publishes itself; maintenance publishes the rest
MAINTENANCE_BATCHES = 4  # what a worker's maintenance publishes per stalled-check tick


class _PausedQueues:
    """This process's view of which queues have a pause, read again when ``CHECK_S`` old."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read_at = float("-inf")
        self.queues: frozenset[str] = frozenset()

    def holds(self, queue: str) -> bool:
        if time.monotonic() - self.read_at > CHECK_S:
            with self.lock:
                if time.monotonic() - self.read_at > CHECK_S:
                    with transaction() as session:
                        self.queues = frozenset(store.paused_queues(session))
                    self.read_at = time.monotonic()
        return queue in self.queues

    def forget(self) -> None:
        self.read_at = float("-inf")


_PAUSED = _PausedQueues()

__all__ = [
    "ALL_TENANTS",
    "Hold",
    "Pause",
    "Resumed",
    "held",
    "hold",
    "hold_delivery",
    "pause",
    "paused",
    "queue_paused",
    "release_unpaused",
    "resume",
]


@dataclass(frozen=True)
class Resumed:
    lifted: bool  # there was such a pause
    released: int  # held jobs published again (those no other pause holds)


def pause(queue: str, tenant_id: str = ALL_TENANTS, by: str | None = None) -> bool:
    """Pause ``queue`` (for ``tenant_id``'s jobs; ``""``: everyone's). ``False``: it was."""
    with transaction() as session:
        new = store.pause(session, queue, tenant_id, by)
        if new:
            _post(session, tenant_id, "queue.paused", {"queue": queue, "pausedBy": by})
    if new:
        log.info(
            "queue %s paused for %s by %s",
            queue,
            _scope(tenant_id),
            by or "?",
            extra={"queue": queue, "tenant_id": tenant_id or None},
        )
    _PAUSED.forget()
    return new


def resume(queue: str, tenant_id: str = ALL_TENANTS, by: str | None = None) -> Resumed:
    """Lift that pause, and publish the jobs it held (unless another pause holds them).

    Up to ``RESUME_BATCHES`` batches are published here, oldest held first; a worker's
    maintenance publishes the rest of a bigger backlog (``release_unpaused``), so the
    caller (an HTTP request) is not held up by a million held jobs.
    """
    with transaction() as session:
        lifted = store.lift(session, queue, tenant_id)
        if lifted:
            _post(session, tenant_id, "queue.resumed", {"queue": queue, "resumedBy": by})
    _PAUSED.forget()
    released = 0
    if lifted:
        released = release_unpaused(queue=queue, tenant_id=tenant_id, batches=RESUME_BATCHES)
        log.info(
            "queue %s resumed for %s by %s: %d held jobs published again",
            queue,
            _scope(tenant_id),
            by or "?",
            released,
            extra={"queue": queue, "tenant_id": tenant_id or None},
        )
    return Resumed(lifted, released)


def _post(session: Session, tenant_id: str, event_type: str, data: dict[str, Any]) -> None:
    """A tenant's own pause set or lifted, to its webhook endpoints (a system-wide one is no
    tenant's event), in the transaction that records it."""
    if tenant_id != ALL_TENANTS:
        webhook_events.post(session, tenant_id, event_type, data, source=uuid.uuid4().hex)


def paused(tenant_id: str | None = None) -> list[Pause]:
    """The pauses in force (``tenant_id``: those that hold that tenant's jobs)."""
    with transaction() as session:
        return store.pauses(session, tenant_id)


def held() -> dict[str, int]:
    """Jobs held by pauses, per queue."""
    with transaction() as session:
        return store.held_counts(session)


def release_unpaused(
    batch: int = RELEASE_BATCH,
    *,
    queue: str | None = None,
    tenant_id: str | None = None,
    batches: int | None = None,
) -> int:
    """Publish again the held jobs that no pause covers any more (``queue``, ``tenant_id``:
    only those a lifted pause held; ``batches``: at most that many); how many were
    published."""
    published = 0
    done = 0
    while batches is None or done < batches:
        with transaction() as session:
            ready, taken = store.release(session, batch, queue, tenant_id)
            # What a broker that fails the publish leaves unsent is parked for the promoter.
            sent = publish_ready(session, ready, announce_waiting=True) if ready else []
        done += 1
        published += len(sent)
        if taken < batch:
            break
    return published


def queue_paused(queue: str) -> bool:
    """Whether ``queue`` has a pause of any scope (as read at most ``CHECK_S`` ago)."""
    return _PAUSED.holds(queue)


def hold(job_id: str) -> Hold:
    """Hold the waiting job ``job_id`` if a pause covers it now (``store.hold``)."""
    with transaction() as session:
        return store.hold(session, job_id)


def hold_delivery(job_id: str) -> Hold:
    """``hold`` for a delivery of a recorded job. A record not visible yet may be in a
    transaction still open (a chain's next step is published inside the one that records
    it): that insert is waited for and the job looked at again, or the claim that follows
    would find it waiting and run it."""
    found = hold(job_id)
    if found is Hold.NO_RECORD and runs.await_insert(job_id):
        found = hold(job_id)
    return found


def _scope(tenant_id: str) -> str:
    return f"tenant {tenant_id}" if tenant_id else "every tenant"
