"""What the API asks of reports: submit, schedule, look up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tasks.jobs import Owner, add
from tasks.jobs.intake.manual_retry import RetryRequest, retry_failed
from tasks.jobs.model.models import JobRecord
from tasks.jobs.observe.queries import get_owned
from tasks.platform import quotas
from tasks.reports.jobs import GENERATE, QUEUE, RETRY_RULES, report_options
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


def retry(owner: Owner, job_id: str, *, actor: str, reason: str) -> None:
    """An operator re-runs a failed report job of its tenant."""
    request = RetryRequest(job_id=job_id, queue=QUEUE, owner=owner, actor=actor, reason=reason)
    rules = RETRY_RULES
    retry_failed(request, audit_ids=rules.audit_ids, conflicts=rules.conflicts)
