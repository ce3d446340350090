"""Stall recovery: an active job whose lock ran out goes back to waiting, or fails.

BullMQ's stalled checker. A job's lock is renewed while its handler runs
(``tasks.jobs.run.lock_renewal``); a worker that died or hung stops renewing, the
lock runs out, and the job is requeued and published again — or fails once it
stalled more than ``KEEL_MAX_STALLED_COUNT`` times, or is cancelled if an owner had
asked to abort it (``tasks.jobs.end.abort``). As with promotion, the
messages are published inside the transaction that requeues the jobs.
"""

from __future__ import annotations

from tasks.jobs.end import ending
from tasks.jobs.end.abort import ABORTED
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.models import State
from tasks.jobs.observe import events
from tasks.jobs.store import upkeep
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

ABORTED_STALLED = f"{ABORTED}: its worker was gone"


def requeue_stalled_once() -> int:
    """Recover every stalled job now (one batch); returns how many were found."""
    with transaction() as session:
        stalled = upkeep.requeue_stalled(session, get_settings().max_stalled_count)
        given_up = [job for job in stalled if job.state == State.FAILED]
        for job in given_up:  # announced below, after its "stalled"
            ending.ended(session, job, State.FAILED, upkeep.STALLED_TOO_OFTEN, announce=False)
        aborted = [job for job in stalled if job.state == State.CANCELLED]
        for job in aborted:
            ending.ended(session, job, State.CANCELLED, ABORTED_STALLED, announce=False)
        sent = publish_ready(session, [job for job in stalled if job.state == State.WAITING])
    for job in stalled:
        events.emit_job(job, "stalled")
    for job in given_up:
        events.emit_job(job, "failed", failedReason=upkeep.STALLED_TOO_OFTEN)
    for job in aborted:
        events.emit_job(job, "cancelled", by="abort", reason=ABORTED_STALLED)
    for job in sent:
        events.emit_job(job, "waiting")
    return len(stalled)
