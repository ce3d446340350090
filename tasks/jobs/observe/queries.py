"""Reading jobs the way the API shows them: owner-scoped, in BullMQ's field names.

Pages of jobs (``list_jobs``) are newest first; the cursor that continues a
page is opaque to clients (base64 of the last job's key, ``store.listing``).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tasks.jobs.model.errors import JobNotFound, Refused
from tasks.jobs.model.models import STATES, JobRecord
from tasks.jobs.model.owner import Owner
from tasks.jobs.store import counts, listing
from tasks.jobs.store import jobs as store
from tasks.jobs.store.listing import JobFilter as JobFilter
from tasks.jobs.store.listing import PageKey
from tasks.platform.db import transaction

MAX_PAGE = 100
DEFAULT_PAGE = 20


def iso(moment: datetime | None) -> str | None:
    """A timestamp as the API shows every one: ISO 8601 in UTC, to the millisecond
    (``2026-12-07T01:16:40.123Z``), whatever the database session's time zone."""
    if moment is None:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
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
        "abortRequestedAt": iso(job.abort_requested_at),
    }


def describe_full(job: JobRecord) -> dict[str, Any]:
    """``describe`` plus what the job was added with: its data, options and user."""
    opts = {**(job.opts or {}), **(job.extra_opts or {})}
    return {**describe(job), "data": job.data, "opts": opts, "userId": job.user_id}


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
    """The record of job ``job_id`` (any tenant's), or ``None`` when there is none."""
    with transaction() as session:
        return store.get(session, job_id)


class InvalidCursor(Refused):
    """The cursor is not one this API gave out."""

    code = "validation_failed"

    def __init__(self) -> None:
        super().__init__(
            "invalid cursor",
            details=[{"field": "cursor", "type": "cursor", "message": "not a cursor of this API"}],
        )


def encode_cursor(job: JobRecord) -> str:
    key = json.dumps([job.created_at.isoformat(), job.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> PageKey:
    """The key a cursor stands for; ``InvalidCursor`` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, job_id = json.loads(raw)
        moment = datetime.fromisoformat(created_at)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidCursor() from None
    if not _storable_id(job_id) or moment.tzinfo is None:
        raise InvalidCursor()
    return PageKey(moment, job_id)


def _storable_id(value: object) -> bool:
    """What a job id column can hold (a NUL or a lone surrogate would fail in the database)."""
    if not isinstance(value, str) or not 0 < len(value) <= 200:
        return False
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class JobPage:
    """One page of jobs, and the cursor of the next (``None``: this is the last)."""

    jobs: list[JobRecord]
    next_cursor: str | None


def list_jobs(where: JobFilter, *, cursor: str | None = None, limit: int = DEFAULT_PAGE) -> JobPage:
    """A page of the jobs ``where`` selects, newest first, after ``cursor`` if given."""
    if not 1 <= limit <= MAX_PAGE:
        raise Refused(f"limit must be 1..{MAX_PAGE}")
    after = decode_cursor(cursor) if cursor is not None else None
    with transaction() as session:
        found = list(listing.page(session, where, after, limit + 1))
    jobs = found[:limit]
    more = len(found) > limit
    return JobPage(jobs, encode_cursor(jobs[-1]) if more else None)


def count_states(where: JobFilter) -> dict[str, int]:
    """Jobs per state among those ``where`` selects (its own ``state`` filter aside).

    A tenant's jobs, or every tenant's (``tenant_id`` None), or one queue's of them, are read
    from the counters (``store.counts``): a few rows, however many records are kept.
    Narrower filters (a user's jobs, a job name) count the records they select.
    """
    if _counted(where):
        return _from_counters(where.tenant_id, where.queue)
    with transaction() as session:
        return listing.state_counts(session, where)


def _counted(where: JobFilter) -> bool:
    narrower = (where.user_id, where.name, where.id_prefix)
    return narrower == (None, None, None) and not where.hidden_names and not where.searching


def _from_counters(tenant_id: str | None, queue: str | None) -> dict[str, int]:
    """A tenant's counters, or (``tenant_id`` None: the every-tenant scope) all of them."""
    found: dict[str, int] = dict.fromkeys(STATES, 0)
    by_queue = (
        counts.by_queue_of_every_tenant() if tenant_id is None else counts.by_queue(tenant_id)
    )
    for counted_queue, states in by_queue.items():
        if queue is None or counted_queue == queue:
            for state, n in states.items():
                found[state] = found.get(state, 0) + n
    return found


def audit_trail(job_id: str) -> list[dict[str, Any]]:
    """A job's manual retries, oldest first: who, why, when, and what each retry cleared."""
    with transaction() as session:
        rows = listing.audits(session, job_id)
        return [
            {
                "retriedBy": row.retried_by,
                "reason": row.reason,
                "recordedAt": iso(row.recorded_at),
                "failedReason": row.failed_reason,
                "attemptsMade": row.attempts_made,
                "attemptsStarted": row.attempts_started,
            }
            for row in rows
        ]
