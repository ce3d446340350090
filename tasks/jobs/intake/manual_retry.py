"""Manual retry: an operator gives a failed job its attempts again, with an audit trail.

The checks run in this order inside one transaction that holds the
job's row lock: owner → state → no live duplicate → no stored result (the
domain's check) → audit row → reset and requeue. Concurrent retries of one
job queue up on the row lock; the first one wins, the others then find the
job live again and are told so (409).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from tasks.jobs.intake.enqueue import publish_or_park
from tasks.jobs.model.errors import InvalidJobState, JobConflict, JobNotFound
from tasks.jobs.model.models import LIVE_STATES, JobRecord, RetryAudit, State
from tasks.jobs.model.options import Deduplication
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import events
from tasks.jobs.observe.queries import owned_by
from tasks.jobs.store import dedup
from tasks.jobs.store import jobs as store
from tasks.platform.db import transaction

# The domain says what else makes a retry pointless (e.g. a stored result): a message, or None.
ConflictCheck = Callable[[Session, JobRecord], str | None]
AuditIds = Callable[[JobRecord], dict[str, Any]]


def _no_conflict(session: Session, job: JobRecord) -> str | None:
    return None


def _job_ids(job: JobRecord) -> dict[str, Any]:
    """Non-secret identifiers only: never the job's data."""
    return {"jobId": job.id, "name": job.name}


@dataclass(frozen=True)
class RetryRules:
    """A job type's rules for manual retries: its audit ids, and what else refuses one."""

    audit_ids: AuditIds = _job_ids
    conflicts: ConflictCheck = _no_conflict


_RULES: dict[str, RetryRules] = {}


def declare_rules(name: str, rules: RetryRules) -> None:
    _RULES[name] = rules


def declared() -> list[str]:
    """The job types that declared retry rules of their own (a bulk retry leaves them out:
    their conflicts are checked one job at a time)."""
    return sorted(_RULES)


def rules_for(name: str) -> RetryRules:
    return _RULES.get(name) or RetryRules()


@dataclass(frozen=True)
class RetryRequest:
    """An operator's retry: ``owner`` is the operator's tenant (``tenant_wide``) or itself.

    ``owner`` ``None``: the caller already checked who may retry this job (a campaign's
    resume retries the campaign's own internal jobs, some of which have no owner; the
    CLI acts for the system). ``queue`` ``None``: a job of any queue.
    """

    job_id: str
    queue: str | None
    owner: Owner | None
    actor: str
    reason: str
    tenant_wide: bool = True
    # A cancelled job (cancelled before it ran, or its run aborted) runs again only when
    # the operator asks for it: a cancel is a decision, a failure is not.
    cancelled_too: bool = False


def _locked_owned(session: Session, request: RetryRequest) -> JobRecord:
    job = store.lock(session, request.job_id)
    visible = request.owner is None or owned_by(job, request.owner, tenant_wide=request.tenant_wide)
    if job is None or not visible or request.queue not in (None, job.queue):
        raise JobNotFound("job not found")
    return job


def _check_state(session: Session, job: JobRecord, request: RetryRequest) -> None:
    if job.state == State.FAILED:
        return
    if job.state == State.CANCELLED and request.cancelled_too:
        if store.was_revoked(session, job.id):
            raise JobConflict(
                "this job was revoked with Celery's revoke, and the workers discard its "
                "messages while they remember it: add a new job instead"
            )
        return
    retried = store.was_retried(session, job.id)
    if job.state in LIVE_STATES and retried:
        raise JobConflict(f"this job was already retried and is {job.state}")
    if job.state == State.CANCELLED:
        raise InvalidJobState(
            "a cancelled job is retried only when asked explicitly (retryCancelled: true)"
        )
    raise InvalidJobState(f"only failed jobs can be retried: {job.state}")


def _check_live_duplicate(session: Session, job: JobRecord) -> Deduplication | None:
    raw = job.opts.get("deduplication")
    if not raw:
        return None
    rule = Deduplication.model_validate(raw)
    holder = dedup.holder_of(session, job.queue, rule.id)
    if holder is not None and holder != job.id:
        raise JobConflict(
            "another job for the same operation is in progress", details=[{"jobId": holder}]
        )
    return rule


def _audit(session: Session, job: JobRecord, request: RetryRequest, ids: dict[str, Any]) -> None:
    """What the reset clears, copied first into the append-only audit table."""
    store.record_audit(
        session,
        RetryAudit(
            job_id=job.id,
            queue=job.queue,
            job_name=job.name,
            tenant_id=job.tenant_id,
            owner_id=job.user_id,
            ids=ids,
            failed_reason=job.failed_reason,
            stacktrace=job.stacktrace,
            attempts_made=job.attempts_made,
            attempts_started=job.attempts_started,
            retried_by=request.actor,
            reason=request.reason,
        ),
    )


def retry(request: RetryRequest) -> JobRecord:
    """Retry a failed job of any type, by the rules its type declared (``declare_rules``)."""
    return retry_failed(
        request,
        audit_ids=lambda job: rules_for(job.name).audit_ids(job),
        conflicts=lambda session, job: rules_for(job.name).conflicts(session, job),
    )


def retry_failed(
    request: RetryRequest,
    *,
    audit_ids: AuditIds,
    conflicts: ConflictCheck,
) -> JobRecord:
    """Give a failed job (or, asked explicitly, a cancelled one) its full attempts again;
    returns the job as it was before."""
    with transaction() as session:
        job = _locked_owned(session, request)
        _check_state(session, job, request)
        rule = _check_live_duplicate(session, job)
        problem = conflicts(session, job)
        if problem:
            raise JobConflict(problem)
        _audit(session, job, request, audit_ids(job))
        held = dedup.claim(session, job.queue, rule, job.id) if rule else None
        if held is not None and held.job_id != job.id:
            raise JobConflict("another job for the same operation is in progress")
        store.reset_for_retry(session, job.id)
    events.emit_job(job, "waiting", manualRetryBy=request.actor)
    publish_or_park(job.id, job.name, job.queue, job.data, job.celery_ctx, tenant=job.tenant_id)
    return job
