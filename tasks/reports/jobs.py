"""Handlers of the ``reports`` queue."""

from __future__ import annotations

import logging
import os
import signal
import time

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from tasks.jobs import (
    Backoff,
    Deduplication,
    JobContext,
    JobOptions,
    Owner,
    UnrecoverableError,
    handler,
)
from tasks.jobs.intake.manual_retry import RetryRules, declare_rules
from tasks.jobs.model.errors import Unavailable
from tasks.jobs.model.models import JobRecord
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.reports import artifacts
from tasks.reports.models import ReportArtifact
from tasks.reports.operation_key import operation_key

log = logging.getLogger(__name__)

QUEUE = "reports"
GENERATE = "report.generate"
CLEANUP = "reports.cleanup"
STEPS = (("load", 20), ("render", 70), ("upload", 95), ("upload", 100))
REPORT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
MAX_ROWS = 100_000
REPORT_ATTEMPTS = 4
REPORT_BACKOFF = Backoff(type="exponential", delay=1000, jitter=0.5)
KEEP_FINISHED = 100


def report_options(key: str | None, delay_ms: int = 0) -> JobOptions:
    """A report job's options: deduplicated by its operation key (when it has one)."""
    return JobOptions(
        deduplication=Deduplication(id=key) if key else None,
        attempts=REPORT_ATTEMPTS,
        backoff=REPORT_BACKOFF,
        delay=delay_ms,
        remove_on_complete=KEEP_FINISHED,
        remove_on_fail=KEEP_FINISHED,
    )


def options_for(data: dict, owner: Owner | None) -> JobOptions:
    """Options of a report sent the Celery way (``generate_report.delay(...)``): the same
    as the API's, deduplicated by the operation key of its owner and data."""
    report_id, rows = data.get("reportId"), data.get("rows")
    if owner is None or not isinstance(report_id, str) or not isinstance(rows, int):
        return report_options(None)
    return report_options(operation_key(owner.tenant_id, owner.user_id, report_id, rows))


class ReportRequest(BaseModel):
    """What a report job's data holds; who asked is the job's owner, never its data."""

    model_config = ConfigDict(extra="forbid", strict=True)

    reportId: str = Field(min_length=1, max_length=200, pattern=REPORT_ID_PATTERN)
    rows: int = Field(ge=1, le=MAX_ROWS)


class TemporaryStorageFailure(Unavailable):
    """The artifact storage failed for now (injected in tests with ``failUntilAttempt``)."""

    code = "storage_unavailable"


def object_key(tenant_id: str, key: str) -> str:
    """``reports/<tenant>/<operation key>.csv``: the tenant id must be a plain name."""
    if "/" in tenant_id or ".." in tenant_id or not tenant_id.strip("."):
        raise UnrecoverableError("the job's tenant id cannot name an object")
    return f"reports/{tenant_id}/{key}.csv"


def requested_by(job: JobContext) -> tuple[str, str]:
    """The tenant and user a report is for: the job's owner."""
    if not job.tenant_id or not job.user_id:
        raise UnrecoverableError(f"{GENERATE} needs an owner (a tenant and a user)")
    return job.tenant_id, job.user_id


@handler(GENERATE, queue=QUEUE, schedulable="tenant", data=ReportRequest, options=options_for)
def generate_report(job: JobContext) -> dict:
    """Generate one report, or return the one already stored for its operation key."""
    data = job.data
    tenant_id, user_id = requested_by(job)
    rows = data.get("rows")
    if not isinstance(rows, int) or rows < 1:
        raise UnrecoverableError("rows must be greater than zero")
    if not isinstance(data.get("reportId"), str):
        raise UnrecoverableError("reportId must be a string")
    key = operation_key(tenant_id, user_id, data["reportId"], rows)
    with transaction() as session:
        existing = artifacts.find(session, key)
        if existing is not None:
            return artifacts.as_result(existing, reused=True)

    settings = get_settings()
    if settings.fault_injection and job.attempts_made < int(data.get("failUntilAttempt") or 0):
        raise TemporaryStorageFailure(
            f"temporary storage failure on attempt {job.attempts_made + 1}"
        )

    pause_s = settings.report_step_pause_ms / 1000
    for index, (step, percent) in enumerate(STEPS):
        job.update_progress({"step": step, "percent": percent})
        if index < len(STEPS) - 1:
            time.sleep(pause_s)

    with transaction() as session:
        stored, _ = artifacts.save_once(
            session,
            ReportArtifact(
                operation_key=key,
                tenant_id=tenant_id,
                report_id=data["reportId"],
                object_key=object_key(tenant_id, key),
                generated_rows=rows,
                job_id=job.id,
            ),
        )
    if settings.fault_injection and data.get("crashAfterStoreOnRun") == job.attempts_started:
        _crash_worker()
    reused = stored.job_id != job.id
    # The line carries the job's fields (tasks.platform.logs): its id, name, queue, tenant, attempt.
    log.info("report %s: %d rows stored as %s", data["reportId"], rows, stored.object_key)
    return artifacts.as_result(stored, reused=reused)


def _crash_worker() -> None:
    """Fault injection: SIGKILL this worker's whole process group, as a power cut would."""
    os.killpg(os.getpgid(0), signal.SIGKILL)


@handler(CLEANUP, queue=QUEUE)
def cleanup_reports(job: JobContext) -> dict:
    """Delete artifacts older than ``keepDays`` (the daily cleanup scheduler's job)."""
    keep_days = job.data.get("keepDays")
    if not isinstance(keep_days, int) or keep_days < 0:
        raise UnrecoverableError("keepDays must be a non-negative integer")
    with transaction() as session:
        return {"removed": artifacts.remove_older_than(session, keep_days)}


def key_of(job: JobRecord) -> str | None:
    """The operation key of a report job, from its owner and data; None if it has none."""
    data = job.data
    report_id, rows = data.get("reportId"), data.get("rows")
    if job.name != GENERATE or not (job.tenant_id and job.user_id):
        return None
    if not isinstance(report_id, str) or not isinstance(rows, int):
        return None
    return operation_key(job.tenant_id, job.user_id, report_id, rows)


def result_exists(session: Session, job: JobRecord) -> str | None:
    """A manual retry of a report already stored is pointless (409)."""
    key = key_of(job)
    if key is not None and artifacts.find(session, key) is not None:
        return "the report for this operation already exists"
    return None


def audit_ids(job: JobRecord) -> dict:
    """Non-secret identifiers only: never the whole payload."""
    return {
        "reportId": job.data.get("reportId"),
        "rows": job.data.get("rows"),
        "operationKey": key_of(job),
    }


# Declared with the handler: a report job retried through the generic jobs API or the
# CLI is judged exactly as through POST /api/v1/reports/jobs/<id>/retry.
RETRY_RULES = RetryRules(audit_ids=audit_ids, conflicts=result_exists)
declare_rules(GENERATE, RETRY_RULES)
