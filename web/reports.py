"""``/api/v1/reports``: submit report jobs and follow them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flask import Blueprint, current_app, g
from pydantic import AwareDatetime, Field, field_validator

from tasks.jobs.observe.queries import iso
from tasks.jobs.observe.queue_counts import counts
from tasks.platform import quotas
from tasks.reports import service
from tasks.reports.jobs import QUEUE, ReportRequest
from web.api import operation
from web.errors import ApiError
from web.job_views import describe
from web.schemas import JobAccepted, JobStatus, Open, RetryJob

bp = Blueprint("reports", __name__, url_prefix="/api/v1/reports")


class CreateReport(ReportRequest):
    failUntilAttempt: int | None = Field(
        default=None,
        ge=0,
        le=5,
        description="fault injection only (KEEL_FAULT_INJECTION=1): fail this many runs first",
    )


class ReportAccepted(JobAccepted):
    deduplicated: bool


def status_url(job_id: str) -> str:
    return f"{bp.url_prefix}/jobs/{job_id}"


@operation(
    bp,
    "",
    "POST",
    summary="Submit a report job",
    body=CreateReport,
    responses={202: ReportAccepted, 400: None, 401: None},
    idempotent=True,
)
def create_report(body: CreateReport):
    _check_fault_injection(body)
    submitted = service.submit(
        g.principal.owner, body.reportId, body.rows, fail_until_attempt=body.failUntilAttempt
    )
    return {
        "jobId": submitted.job_id,
        "accepted": True,
        "statusUrl": status_url(submitted.job_id),
        "deduplicated": submitted.deduplicated,
    }, 202


def _check_fault_injection(body: CreateReport) -> None:
    if body.failUntilAttempt is not None and not current_app.config["KEEL_FAULT_INJECTION"]:
        raise ApiError(
            400,
            "failUntilAttempt is accepted only with fault injection enabled",
            code="validation_failed",
            details=[
                {
                    "field": "failUntilAttempt",
                    "message": "fault injection is off",
                    "type": "forbidden",
                }
            ],
        )


@operation(
    bp,
    "/jobs/<job_id>",
    "GET",
    summary="A report job's state, progress and result (operators: any job of their tenant)",
    responses={200: JobStatus, 401: None, 404: None},
)
def get_job(job_id: str):
    principal = g.principal
    return describe(service.get_job(principal.owner, job_id, tenant_wide=principal.operator))


@operation(
    bp,
    "/jobs/<job_id>/retry",
    "POST",
    summary="Operator retry of a failed report job",
    body=RetryJob,
    role="operator",
    responses={202: JobAccepted, 400: None, 403: None, 404: None, 409: None},
)
def retry_job(job_id: str, body: RetryJob):
    principal = g.principal
    service.retry(principal.owner, job_id, actor=principal.user_id, reason=body.reason)
    return {"jobId": job_id, "accepted": True, "statusUrl": status_url(job_id)}, 202


class ScheduleReport(CreateReport):
    runAt: AwareDatetime = Field(strict=False, description="ISO-8601 with a time zone")

    @field_validator("runAt")
    @classmethod
    def _representable_in_utc(cls, run_at: datetime) -> datetime:
        """``9999-12-31T23:59:59-23:59`` parses but has no UTC time: 400, not an OverflowError."""
        try:
            run_at.astimezone(UTC)
        except OverflowError:
            raise ValueError("runAt is outside the representable range") from None
        return run_at


class ReportScheduled(JobAccepted):
    runAt: str


@operation(
    bp,
    "/scheduled",
    "POST",
    summary="Schedule a report job for later",
    body=ScheduleReport,
    responses={202: ReportScheduled, 400: None},
)
def schedule_report(body: ScheduleReport):
    now = datetime.now(UTC)
    if body.runAt <= now:
        raise ApiError(
            400,
            "runAt must be in the future",
            code="validation_failed",
            details=[{"field": "runAt", "message": "not in the future", "type": "value_error"}],
        )
    horizon = quotas.current().max_delay_seconds
    if body.runAt > now + timedelta(seconds=horizon):
        raise ApiError(
            400,
            f"runAt may be at most {horizon} s ahead",
            code="validation_failed",
            details=[
                {
                    "field": "runAt",
                    "limit": "maxDelaySeconds",
                    "max": horizon,
                    "type": "value_error",
                }
            ],
        )
    _check_fault_injection(body)
    submitted = service.submit(
        g.principal.owner,
        body.reportId,
        body.rows,
        fail_until_attempt=body.failUntilAttempt,
        run_at=body.runAt,
        now=now,
    )
    return {
        "jobId": submitted.job_id,
        "accepted": True,
        "statusUrl": status_url(submitted.job_id),
        "runAt": iso(body.runAt.astimezone(UTC)),
    }, 202


class QueueHealth(Open):
    waiting: int
    active: int
    delayed: int
    completed: int
    failed: int


@operation(
    bp,
    "/queue/health",
    "GET",
    summary="The tenant's jobs per state in the reports queue",
    role="operator",
    responses={200: QueueHealth},
)
def queue_health():
    found = counts(QUEUE, g.principal.tenant_id)
    return {
        state: found[state] for state in ("waiting", "active", "delayed", "completed", "failed")
    }
