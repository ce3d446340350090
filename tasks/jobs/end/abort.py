"""Abort: an owner or operator stops a job that is running; it ends ``cancelled``.

``DELETE /api/v1/jobs/<id>`` of an active job (``tasks.jobs.end.cancel``) does not end it
at once: the run is in a worker's hands. ``mark`` sets the record's ``abort_requested_at``,
writes who and why to the append-only ``job_actions`` audit, and announces ``aborting``.
From then on:

- the handler can see it (``self.is_aborted()``, ``job.is_aborted()``: one read of the
  record) and stop cleanly;
- whatever the run then returns, raises or defers, its end is refused by the guarded
  statements of ``store.runs`` and recorded by ``ended_run`` instead: the job is
  ``cancelled`` (its run's outcome too), its dedup claim freed, its chord's body failed,
  its ``cancelled`` event sent; it never runs again, as no retry is scheduled;
- a run still going after the grace period (``KEEL_ABORT_GRACE_S``) is stopped by its
  worker (``tasks.jobs.run.termination``) and ended the same way;
- a run whose worker died is cancelled by the stalled check once its lock runs out, not
  requeued (``store.upkeep.requeue_stalled``); no delivery takes it over meanwhile.

Asking again while the abort is under way answers the job as it is and writes no second
audit row. A cancelled job is retried only when the operator asks for it explicitly
(``tasks.jobs.intake.manual_retry``).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session

from tasks.jobs.end import ending
from tasks.jobs.model.errors import ControlFlow
from tasks.jobs.model.models import JobRecord, State
from tasks.jobs.observe import events
from tasks.jobs.store import jobs as jobs_store
from tasks.jobs.store import runs
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform.db import transaction

ABORTED = "aborted on request"
AUDIT_ACTION = "abort"


class Aborted(ControlFlow):
    """The run's job was being aborted: it ended ``cancelled``, not as the run ended."""

    code = "aborted"


def mark(session: Session, job: JobRecord, *, actor: str, reason: str | None) -> None:
    """In the transaction holding ``job``'s row lock (an active job): ask for its run to be
    aborted, audited and announced once; asked again, nothing more happens."""
    if not runs.mark_abort(session, job.id):
        return
    details: dict[str, object] = {"state": str(job.state), "attempt": job.attempts_started}
    if reason:
        details["reason"] = reason
    jobs_store.add_action(session, job.id, job.tenant_id, AUDIT_ACTION, actor, details)
    queue, job_id, name, tenant = job.queue, job.id, job.name, job.tenant_id
    _after_commit(
        session, lambda: events.emit(queue, "aborting", job_id, name, by=actor, tenant=tenant)
    )


def _after_commit(session: Session, announce: Callable[[], None]) -> None:
    event.listen(session, "after_commit", lambda _session: announce(), once=True)


def ended_run(session: Session, claimed: ClaimedJob, reason: str = ABORTED) -> bool:
    """In the caller's transaction: end the run of a job being aborted, and the job,
    ``cancelled``; ``False`` if no abort was asked or the run is no longer the job's."""
    job = runs.end_aborted(session, claimed, reason)
    if job is None:
        return False
    ending.ended(session, job, State.CANCELLED, reason, announce=False)
    queue, job_id, name, tenant = job.queue, job.id, job.name, job.tenant_id
    _after_commit(
        session,
        lambda: events.emit(
            queue, "cancelled", job_id, name, by="abort", reason=reason, tenant=tenant
        ),
    )
    return True


def end_run(claimed: ClaimedJob, reason: str = ABORTED) -> bool:
    """``ended_run`` in its own transaction."""
    with transaction() as session:
        return ended_run(session, claimed, reason)
