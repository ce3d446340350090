"""Handlers of the ``reports`` queue."""

from __future__ import annotations

import os
import signal
import time

from tasks.config import get_settings
from tasks.db import transaction
from tasks.jobs import JobContext, UnrecoverableError, handler
from tasks.reports import artifacts
from tasks.reports.models import ReportArtifact
from tasks.reports.operation_key import operation_key

QUEUE = "reports"
GENERATE = "report.generate"
CLEANUP = "reports.cleanup"
STEPS = (("load", 20), ("render", 70), ("upload", 95), ("upload", 100))


class TemporaryStorageFailure(Exception):
    """The artifact storage failed for now (injected in tests with ``failUntilAttempt``)."""


def _object_key(tenant_id: str, key: str) -> str:
    return f"reports/{tenant_id}/{key}.csv"


@handler(GENERATE, queue=QUEUE)
def generate_report(job: JobContext) -> dict:
    """Generate one report, or return the one already stored for its operation key."""
    data = job.data
    rows = data.get("rows")
    if not isinstance(rows, int) or rows < 1:
        raise UnrecoverableError("rows must be greater than zero")
    key = operation_key(data["tenantId"], data["requestedBy"], data["reportId"], rows)
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
                tenant_id=data["tenantId"],
                report_id=data["reportId"],
                object_key=_object_key(data["tenantId"], key),
                generated_rows=rows,
                job_id=job.id,
            ),
        )
    if settings.fault_injection and data.get("crashAfterStoreOnRun") == job.attempts_started:
        _crash_worker()
    return artifacts.as_result(stored, reused=stored.job_id != job.id)


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
