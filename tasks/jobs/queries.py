"""Reading jobs the way the API shows them: owner-scoped, in BullMQ's field names."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tasks.db import transaction
from tasks.jobs.errors import JobNotFound
from tasks.jobs.models import JobRecord
from tasks.jobs.owner import Owner
from tasks.jobs.store import jobs as store


def iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe(job: JobRecord) -> dict[str, Any]:
    """BullMQ's job fields in camelCase, plus the timeline of runs."""
    return {
        "jobId": job.id,
        "name": job.name,
        "queue": job.queue,
        "state": job.state,
        "progress": job.progress if job.progress is not None else 0,
        "attemptsMade": job.attempts_made,
        "attemptsStarted": job.attempts_started,
        "stalledCount": job.stalled_count,
        "failedReason": job.failed_reason,
        "result": job.result,
        "createdAt": iso(job.created_at),
        "processedOn": iso(job.processed_on),
        "finishedOn": iso(job.finished_on),
        "runAt": iso(job.run_at),
        "runs": job.runs,
    }


def owned_by(job: JobRecord | None, owner: Owner, *, tenant_wide: bool = False) -> bool:
    """Whether ``owner`` may see ``job``: its own, or (``tenant_wide``, operators) its tenant's."""
    if job is None or job.tenant_id != owner.tenant_id:
        return False
    return tenant_wide or job.user_id == owner.user_id


def get_owned(
    job_id: str, owner: Owner, *, queue: str | None = None, tenant_wide: bool = False
) -> JobRecord:
    """The job if ``owner`` may see it; anything else looks exactly like a missing job."""
    job = get(job_id)
    if job is None or not owned_by(job, owner, tenant_wide=tenant_wide):
        raise JobNotFound("job not found")
    if queue is not None and job.queue != queue:
        raise JobNotFound("job not found")
    return job


def get(job_id: str) -> JobRecord | None:
    with transaction() as session:
        return store.get(session, job_id)
