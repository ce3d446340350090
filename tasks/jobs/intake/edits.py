"""Editing one job before it runs: BullMQ's ``job.updateData()``, ``changeDelay()`` and
``promote()``.

- ``update_data``: an operator replaces the data of a waiting or delayed job of a type
  tenants may submit (not deduplicated, not part of a canvas), checked as a submission
  is (the job type's ``data`` model; no identity fields; a Celery-style task's
  ``{"args": [...], "kwargs": {...}}``). The claim reads the data from the record,
  so the next run sees it, even for a job whose message is already queued.
- ``change_delay``: a delayed job is due ``delay_ms`` from now instead.
- ``promote``: a delayed job becomes waiting and is published now (a paused queue still
  holds it).

Each locks the job's row, so it is ordered with a claim: the claim either ran first (the
job is active: 409) or reads what the edit wrote. Each writes one row of ``job_actions``
(append-only) in the same transaction, saying who did what (for data: which fields
changed and digests, never the data itself).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy.orm import Session

from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.intake.submit import SubmissionRefused, check_data, task_style
from tasks.jobs.model import registry
from tasks.jobs.model.errors import JobConflict, JobNotFound
from tasks.jobs.model.models import JobRecord, State
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import events
from tasks.jobs.observe.queries import owned_by
from tasks.jobs.store import jobs as store
from tasks.jobs.store import upkeep
from tasks.platform.db import transaction

DATA_EDITABLE = (State.WAITING, State.DELAYED)


def _locked(session: Session, job_id: str, owner: Owner, tenant_wide: bool) -> JobRecord:
    job = store.lock(session, job_id)
    if job is None or not owned_by(job, owner, tenant_wide=tenant_wide):
        raise JobNotFound("job not found")
    return job


def _refuse(job: JobRecord, what: str, states: tuple[State, ...]) -> None:
    if job.state not in states:
        allowed = " or ".join(str(s) for s in states)
        article = "an" if str(job.state)[0] in "aeiou" else "a"
        raise JobConflict(
            f"{article} {job.state} job cannot {what}: only a {allowed} one can",
            details=[{"jobId": job.id, "state": job.state}],
        )


def _audit(session: Session, job: JobRecord, action: str, actor: str, **details: Any) -> None:
    store.add_action(session, job.id, job.tenant_id, action, actor, details)


def update_data(
    job_id: str, owner: Owner, data: dict[str, Any], *, actor: str, reason: str
) -> JobRecord:
    """Replace a waiting or delayed job's data (an operator of its tenant)."""
    with transaction() as session:
        job = _locked(session, job_id, owner, tenant_wide=True)
        _refuse(job, "have its data changed", DATA_EDITABLE)
        _refuse_data_edit(job)
        _check_shape(job.name, data)
        # Which fields changed and digests of both: never the data itself (it may hold
        # what retention must be able to delete, and this table keeps every row).
        # (a record of an earlier release may hold data that is not an object: all changed)
        was = job.data if isinstance(job.data, dict) else {}
        changed = sorted(k for k in set(was) | set(data) if was.get(k) != data.get(k))
        _audit(
            session,
            job,
            "update_data",
            actor,
            reason=reason,
            changedFields=changed,
            before=_digest(job.data),
            after=_digest(data),
        )
        job.data = data
        session.flush()
        session.refresh(job)
    return job


def _refuse_data_edit(job: JobRecord) -> None:
    """Only the data of a job type tenants may submit is theirs to change: the data of
    Keel's own jobs (a campaign's chunks, say) is trusted by their handlers. A job that
    is deduplicated (its dedup id was derived from the data it had) or part of a canvas
    (its parent or chord counts it as it was sent) keeps its data too."""
    job_type = registry.get(job.name)
    if job_type is None or not job_type.submittable:
        raise JobConflict(
            f"the data of a {job.name} job cannot be changed: only job types tenants may "
            "submit can",
            details=[{"jobId": job.id, "name": job.name}],
        )
    if (job.opts or {}).get("deduplication"):
        raise JobConflict(
            "a deduplicated job's data cannot be changed: its deduplication id was made from it",
            details=[{"jobId": job.id}],
        )
    ctx = job.celery_ctx or {}
    if any(ctx.get(key) for key in ("chord", "group", "chain")):
        raise JobConflict(
            "the data of a job in a chain, group or chord cannot be changed",
            details=[{"jobId": job.id}],
        )


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _check_shape(name: str, data: dict[str, Any]) -> None:
    if task_style(name) == "celery" and (
        set(data) - {"args", "kwargs"}
        or not isinstance(data.get("args", []), list)
        or not isinstance(data.get("kwargs", {}), dict)
    ):
        raise SubmissionRefused(
            "data", 'a Celery-style task\'s data is {"args": [...], "kwargs": {...}}'
        )
    job_type = registry.get(name)
    if job_type is not None:
        check_data(job_type, data, "data")


def change_delay(
    job_id: str, owner: Owner, delay_ms: int, *, actor: str, tenant_wide: bool = False
) -> JobRecord:
    """A delayed job is due ``delay_ms`` from now (its owner, or an operator of its tenant)."""
    with transaction() as session:
        job = _locked(session, job_id, owner, tenant_wide)
        _refuse(job, "have its delay changed", (State.DELAYED,))
        before = job.run_at
        upkeep.set_run_at(session, job.id, delay_ms)
        session.refresh(job)
        _audit(
            session,
            job,
            "change_delay",
            actor,
            delayMs=delay_ms,
            before=before.isoformat() if before else None,
            after=job.run_at.isoformat() if job.run_at else None,
        )
    events.emit_job(job, "delayed", delay=delay_ms)
    return job


def promote(job_id: str, owner: Owner, *, actor: str, tenant_wide: bool = False) -> JobRecord:
    """A delayed job becomes waiting and is published now (its owner, or an operator)."""
    with transaction() as session:
        job = _locked(session, job_id, owner, tenant_wide)
        _refuse(job, "be promoted", (State.DELAYED,))
        before = job.run_at
        ready = upkeep.promote_now(session, [job.id])
        sent = publish_ready(session, ready)
        _audit(session, job, "promote", actor, before=before.isoformat() if before else None)
        session.refresh(job)
    if sent:
        events.emit_job(job, "waiting")
    return job
