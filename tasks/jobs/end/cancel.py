"""Cancel: a job that has not started a run never will.

A waiting, delayed or waiting-children job becomes ``cancelled`` in one
guarded statement on its locked row (``store.jobs.cancel``), and in the same
transaction it is finished like a completed or failed one (``ending.finished``):
its simple-mode deduplication claim is released, and retention counts it with
``removeOnFail``, separately from failed records. A cancelled job is final:
the claim only takes waiting jobs, so a message still on its way is
acknowledged and ignored, and the promoter only wakes delayed ones.

An active job is running: its run is aborted instead (``tasks.jobs.end.abort``), and the
job ends ``cancelled`` once the run stops. A finished job cannot be cancelled (409);
cancelling a cancelled job again answers it as it is. For an owner,
another tenant's or user's job is indistinguishable from a missing one (404).
Celery's ``revoke`` lands here too (``tasks.jobs.end.revocations``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from tasks.jobs.end import abort, ending
from tasks.jobs.model.errors import JobConflict, JobNotFound
from tasks.jobs.model.models import CANCELLABLE_STATES, JobRecord, State
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import events
from tasks.jobs.observe.queries import owned_by
from tasks.jobs.store import jobs as store
from tasks.jobs.store.jobs import CancelledJob
from tasks.platform.db import transaction


@dataclass(frozen=True)
class Cancelling:
    """What a cancel did: the job as it is now, and whether its run is being aborted."""

    job: JobRecord
    aborting: bool = False


def cancel(
    job_id: str,
    owner: Owner | None,
    *,
    tenant_wide: bool = False,
    actor: str = "system",
    reason: str | None = None,
    audit: bool = False,
) -> Cancelling:
    """Cancel ``job_id`` for ``owner`` (``None``: the system, any job), or abort its run if
    it is active (``actor`` and ``reason`` go to the audit; ``audit``: a job not running
    is audited too)."""
    done: list[CancelledJob] = []
    with transaction() as session:
        job = store.lock(session, job_id)
        if job is None or (owner is not None and not owned_by(job, owner, tenant_wide=tenant_wide)):
            raise JobNotFound("job not found")
        if job.state == State.ACTIVE:
            abort.mark(session, job, actor=actor, reason=reason)
            session.refresh(job)
            return Cancelling(job, aborting=True)
        if job.state != State.CANCELLED:
            if job.state not in CANCELLABLE_STATES:
                raise JobConflict(
                    f"a {job.state} job cannot be cancelled: it has finished",
                    details=[{"jobId": job.id, "state": job.state}],
                )
            done = cancel_in(
                session,
                [job.id],
                CANCELLABLE_STATES,
                actor=actor if audit else None,
                reason=reason if audit else None,
            )
            session.refresh(job)
    announce(done, by="owner" if owner is not None else "system")
    return Cancelling(job)


def cancel_many(job_ids: Sequence[str], states: Sequence[State], *, by: str) -> list[str]:
    """Cancel those of ``job_ids`` still in ``states`` (others are left alone); their ids.

    ``by="revoke"`` (Celery's ``revoke``) is audited in ``job_actions``: the workers go on
    discarding the job's messages while they remember the revoke, so a retry of it would be
    discarded too (``tasks.jobs.intake.manual_retry`` refuses it).
    """
    with transaction() as session:
        done = cancel_in(session, job_ids, states)
        if by == store.REVOKED:
            store.note_revoked(session, done)
    announce(done, by=by)
    return [job.id for job in done]


def cancel_in(
    session: Session,
    job_ids: Sequence[str],
    states: Sequence[State],
    *,
    actor: str | None = None,
    reason: str | None = None,
) -> list[CancelledJob]:
    """In the caller's transaction: cancel those of ``job_ids`` in ``states``, each ended
    as any cancelled job is; the caller announces them (``announce``) once it commits.
    With an ``actor``, each is audited in ``job_actions`` with the ``reason``."""
    done = store.cancel(session, job_ids, states)
    for job in done:  # announced by the caller, saying by whom
        ending.ended(session, job, State.CANCELLED, reason or "cancelled", announce=False)
    if actor is not None and done:
        store.note_cancelled(session, done, actor=actor, reason=reason or "cancelled")
    return done


def announce(done: list[CancelledJob], *, by: str) -> None:
    for job in done:
        events.emit_job(job, "cancelled", by=by)
