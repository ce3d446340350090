"""What the API asks of reports: submit, schedule, look up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from tasks import quotas
from tasks.jobs import Owner, add
from tasks.jobs.manual_retry import RetryRequest, retry_failed
from tasks.jobs.models import JobRecord
from tasks.jobs.queries import get_owned
from tasks.reports import artifacts
from tasks.reports.jobs import GENERATE, QUEUE, report_options
from tasks.reports.operation_key import operation_key


@dataclass(frozen=True)
class Submitted:
    job_id: str
    deduplicated: bool
    operation_key: str


def submit(
    owner: Owner,
    report_id: str,
    rows: int,
    *,
    fail_until_attempt: int | None = None,
    run_at: datetime | None = None,
    now: datetime | None = None,
) -> Submitted:
    """Enqueue ``report.generate`` for ``owner`` (from the token, never the body), within quota."""
    data: dict = {"reportId": report_id, "rows": rows}
    if fail_until_attempt is not None:
        data["failUntilAttempt"] = fail_until_attempt
    delay_ms = 0
    if run_at is not None and now is not None:
        delay_ms = max(1, int((run_at - now).total_seconds() * 1000))
    key = operation_key(owner.tenant_id, owner.user_id, report_id, rows)
    added = add(
        GENERATE,
        data,
        queue=QUEUE,
        opts=report_options(key, delay_ms),
        owner=owner,
        limits=quotas.current().jobs,
    )
    return Submitted(job_id=added.job_id, deduplicated=not added.created, operation_key=key)


def get_job(owner: Owner, job_id: str, *, tenant_wide: bool = False) -> JobRecord:
    """A report job of ``owner`` (an operator: ``tenant_wide``, any of the tenant's)."""
    return get_owned(job_id, owner, queue=QUEUE, tenant_wide=tenant_wide)


def _key_of(job: JobRecord) -> str | None:
    """The operation key of a report job, from its owner and data; None if it has none."""
    data = job.data
    report_id, rows = data.get("reportId"), data.get("rows")
    if job.name != GENERATE or not (job.tenant_id and job.user_id):
        return None
    if not isinstance(report_id, str) or not isinstance(rows, int):
        return None
    return operation_key(job.tenant_id, job.user_id, report_id, rows)


def _result_exists(session: Session, job: JobRecord) -> str | None:
    key = _key_of(job)
    if key is not None and artifacts.find(session, key) is not None:
        return "the report for this operation already exists"
    return None


def _audit_ids(job: JobRecord) -> dict:
    """Non-secret identifiers only: never the whole payload."""
    return {
        "reportId": job.data.get("reportId"),
        "rows": job.data.get("rows"),
        "operationKey": _key_of(job),
    }


def retry(owner: Owner, job_id: str, *, actor: str, reason: str) -> None:
    """An operator re-runs a failed report job of its tenant."""
    request = RetryRequest(job_id=job_id, queue=QUEUE, owner=owner, actor=actor, reason=reason)
    retry_failed(request, audit_ids=_audit_ids, conflicts=_result_exists)
