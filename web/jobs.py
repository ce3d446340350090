"""``/api/v1/jobs``: jobs of any type — list, read, cancel, retry, and submit the submittable.

Owner-scoped like every job endpoint: a user sees and cancels its own jobs,
an operator every job of its tenant; another tenant's (or, for a user, another
user's) job answers exactly like a missing one (404). Listing is newest
first, a page at a time (``?cursor=`` from the previous page's ``nextCursor``).

``POST`` adds a job of a type declared ``submittable`` (``tasks.jobs.intake.submit``):
``{name, data?, args?, kwargs?, opts?}``. ``opts`` is a bounded subset of the
job options — ``attempts``, ``backoff``, ``delay`` (at most the tenant quota
``maxDelaySeconds``, as is the longest backoff wait), ``removeOnComplete``,
``removeOnFail`` — with no ``jobId`` nor ``deduplication``: those are keys
shared across tenants. A name that is unknown or not submittable is a 400
naming ``name``, like any other refused field of the body.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Blueprint, g
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs.end.cancel import Cancelling, cancel
from tasks.jobs.intake import edits
from tasks.jobs.intake.enqueue import AddedJob
from tasks.jobs.intake.manual_retry import RetryRequest, retry
from tasks.jobs.intake.submit import Submission, submit
from tasks.jobs.model.models import JobRecord
from tasks.jobs.model.options import (
    MAX_TIMEOUT_MS,
    JobOptions,
    backoff_max_ms,
    capped_timeout,
    timeout_cap_ms,
)
from tasks.jobs.observe import job_logs
from tasks.jobs.observe.queries import (
    get_owned,
    list_jobs,
)
from tasks.platform import quotas
from web import events
from web.api import operation
from web.auth import OPERATOR, Principal
from web.errors import ApiError
from web.idempotency import job_id_for
from web.job_query import TEXT, JobListQuery, visible_to
from web.job_views import describe, describe_full
from web.schedulers import MAX_PERIOD_MS, Keep, TemplateBackoff, TemplateKeepJobs
from web.schemas import (
    JobAccepted,
    JobList,
    JobView,
    Open,
    RetryJob,
    Strict,
    configured_bound,
)

bp = Blueprint("jobs", __name__, url_prefix="/api/v1/jobs")


class CancelQuery(BaseModel):
    """``DELETE /api/v1/jobs/<id>``: why (kept in the audit of an abort)."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, min_length=1, max_length=2000, pattern=TEXT)


class JobLogQuery(BaseModel):
    """Paging of ``GET /api/v1/jobs/<id>/logs``."""

    model_config = ConfigDict(extra="forbid")

    after: int = Field(default=0, ge=0, le=2**31 - 1, description="the next of the previous page")
    limit: int = Field(default=job_logs.DEFAULT_PAGE, ge=1, le=job_logs.MAX_PAGE)


class JobLogLine(Open):
    seq: int = Field(description="the line's number among every line the job wrote, from 1")
    attempt: int = Field(description="the run that wrote it")
    loggedAt: datetime
    message: str


class JobLog(Open):
    jobId: str
    logs: list[JobLogLine]
    written: int = Field(
        description="lines the job wrote in all; only the newest KEEL_JOB_LOG_LINES are kept"
    )
    next: int | None = Field(description="pass as ?after= for the next page; null: no more yet")


class UpdateJobData(Strict):
    """A waiting or delayed job's new data, and why (kept in the ``job_actions`` audit)."""

    data: dict[str, Any] = Field(
        description="the whole new data, checked as a submission's is (a Celery-style "
        'task\'s: {"args": [...], "kwargs": {...}})'
    )
    reason: str = Field(min_length=10, max_length=2000, pattern=TEXT)


class ChangeDelay(Strict):
    delay: int = Field(
        ge=0,
        le=MAX_PERIOD_MS,
        description="milliseconds from now, at most the tenant quota maxDelaySeconds",
        json_schema_extra=configured_bound("maximum", lambda: _max_delay_ms()),
    )


def _max_delay_ms() -> int:
    return quotas.current().max_delay_seconds * 1000


class SubmitOptions(Strict):
    """The job options a tenant's user may set."""

    attempts: int = Field(default=1, ge=1, le=100)
    backoff: TemplateBackoff | None = None
    delay: int = Field(
        default=0,
        ge=0,
        le=MAX_PERIOD_MS,
        description="milliseconds, at most the tenant quota maxDelaySeconds",
        json_schema_extra=configured_bound("maximum", _max_delay_ms),
    )
    # Unset: the default ages (tasks.jobs.upkeep.retention); false keeps every record.
    removeOnComplete: bool | Keep | TemplateKeepJobs | None = None
    removeOnFail: bool | Keep | TemplateKeepJobs | None = None
    timeout: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TIMEOUT_MS,
        description="milliseconds a run may take: past it the run fails, timed out (then "
        "runs again by attempts and backoff); at most KEEL_MAX_JOB_TIMEOUT_S",
        json_schema_extra=configured_bound("maximum", timeout_cap_ms),
    )
    concurrencyKey: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="the job's key for its type's key concurrency (your tenant's keys only); on "
        "a type that declares none, one job of the key runs at a time, in line",
    )

    @field_validator("timeout")
    @classmethod
    def _timeout_within_the_cap(cls, timeout: int | None) -> int | None:
        # The workers' grace covers this long a run (a 400 naming opts.timeout past it).
        return capped_timeout(timeout)


class SubmitJob(Strict):
    """A job to add: ``data``, or for a Celery-style task ``args``/``kwargs`` instead."""

    name: str = Field(min_length=1, max_length=200)
    data: dict[str, Any] | None = None
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    opts: SubmitOptions = Field(default_factory=SubmitOptions)


class JobSubmitted(JobAccepted):
    state: str


def status_url(job_id: str) -> str:
    return f"{bp.url_prefix}/{job_id}"


def _summary(job: JobRecord) -> dict[str, Any]:
    return {**describe(job), "userId": job.user_id}


# Who sees and acts on which job, for the API and the dashboard (``web.ui``) alike: a user
# its own jobs, an operator every job of its tenant; anything else is a missing job (404).


def read_job(principal: Principal, job_id: str) -> JobRecord:
    return get_owned(job_id, principal.owner, tenant_wide=principal.operator)


def cancel_for(principal: Principal, job_id: str, reason: str | None = None) -> Cancelling:
    """Cancel a job that has not run, or abort an active job's run (audited: who, why)."""
    return cancel(
        job_id,
        principal.owner,
        tenant_wide=principal.operator,
        actor=principal.user_id,
        reason=reason,
    )


def retry_for(
    principal: Principal, job_id: str, reason: str, *, cancelled_too: bool = False
) -> JobRecord:
    """An operator's retry (the caller checked the role): audited, by the job type's rules;
    a cancelled job only with ``cancelled_too``."""
    load_job_modules()  # every job type's retry rules declared
    request = RetryRequest(
        job_id=job_id,
        queue=None,
        owner=principal.owner,
        actor=principal.user_id,
        reason=reason,
        cancelled_too=cancelled_too,
    )
    return retry(request)


@operation(
    bp,
    "",
    "GET",
    summary="Jobs of any type, newest first, a page at a time (operators: the tenant's); "
    "filtered and searched by data fields, id prefix, times and error text",
    query=JobListQuery,
    responses={200: JobList, 400: None},
)
def list_all(query: JobListQuery):
    page = list_jobs(visible_to(g.principal, query), cursor=query.cursor, limit=query.limit)
    return {"jobs": [_summary(job) for job in page.jobs], "nextCursor": page.next_cursor}


@operation(
    bp,
    "/<job_id>",
    "GET",
    summary="One job: state, progress, result, data and options",
    responses={200: JobView, 404: None},
)
def get_job(job_id: str):
    return describe_full(read_job(g.principal, job_id))


@operation(
    bp,
    "/<job_id>/logs",
    "GET",
    summary="The lines the job's handler wrote with job.log() / self.log(), oldest first",
    query=JobLogQuery,
    responses={200: JobLog, 400: None, 404: None},
)
def get_job_logs(job_id: str, query: JobLogQuery):
    job = read_job(g.principal, job_id)
    return job_logs.page(job.id, after=query.after, limit=query.limit)


@operation(
    bp,
    "/<job_id>",
    "DELETE",
    summary="Cancel a waiting or delayed job: it becomes cancelled and never runs. Of an "
    "active job, abort its run (202, abortRequestedAt set): the job ends cancelled once the "
    "run stops, stopped by its worker after KEEL_ABORT_GRACE_S (409 once it is finished)",
    query=CancelQuery,
    responses={200: JobView, 202: JobView, 400: None, 404: None, 409: None},
)
def cancel_job(job_id: str, query: CancelQuery):
    done = cancel_for(g.principal, job_id, query.reason)
    return describe_full(done.job), 202 if done.aborting else 200


@operation(
    bp,
    "/<job_id>/retry",
    "POST",
    summary="Operator retry of a failed job of the tenant (audited first); of a cancelled "
    "one only with retryCancelled: true",
    body=RetryJob,
    role=OPERATOR,
    responses={202: JobAccepted, 400: None, 403: None, 404: None, 409: None},
)
def retry_job(job_id: str, body: RetryJob):
    retry_for(g.principal, job_id, body.reason, cancelled_too=body.retryCancelled)
    return {"jobId": job_id, "accepted": True, "statusUrl": status_url(job_id)}, 202


@operation(
    bp,
    "/<job_id>/events",
    "GET",
    summary="A job's events as Server-Sent Events (replayed, then live; Last-Event-ID "
    "resumes); ends after completed/failed/cancelled or ?timeout= seconds (default 30, max "
    "300); 503 when the server has no room for another stream, or the caller's user or "
    "tenant already holds its share of open streams (KEEL_STREAMS_PER_USER, "
    "KEEL_STREAMS_PER_TENANT)",
    responses={200: None, 400: None, 401: None, 404: None, 503: None},
    produces="text/event-stream",
)
def get_job_events(job_id: str):
    timeout = events.timeout_s()
    return events.stream_response(read_job(g.principal, job_id), timeout)


@operation(
    bp,
    "/<job_id>/data",
    "PUT",
    summary="Operator: replace a waiting or delayed job's data (audited; 409 once it runs)",
    body=UpdateJobData,
    role=OPERATOR,
    responses={200: JobView, 400: None, 403: None, 404: None, 409: None},
)
def update_job_data(job_id: str, body: UpdateJobData):
    load_job_modules()  # every job type's data model declared
    principal = g.principal
    job = edits.update_data(
        job_id, principal.owner, body.data, actor=principal.user_id, reason=body.reason
    )
    return describe_full(job)


@operation(
    bp,
    "/<job_id>/delay",
    "POST",
    summary="Change a delayed job's delay: it is due that many milliseconds from now",
    body=ChangeDelay,
    responses={200: JobView, 400: None, 404: None, 409: None},
)
def change_job_delay(job_id: str, body: ChangeDelay):
    most = _max_delay_ms()
    if body.delay > most:
        raise ApiError(
            400,
            f"the delay must be at most {most // 1000} s",
            code="validation_failed",
            details=[
                {
                    "field": "delay",
                    "type": "value_error",
                    "limit": "maxDelaySeconds",
                    "max": most // 1000,
                }
            ],
        )
    principal = g.principal
    job = edits.change_delay(
        job_id,
        principal.owner,
        body.delay,
        actor=principal.user_id,
        tenant_wide=principal.operator,
    )
    return describe_full(job)


@operation(
    bp,
    "/<job_id>/promote",
    "POST",
    summary="Promote a delayed job: it waits to run now (409 unless delayed)",
    responses={200: JobView, 404: None, 409: None},
)
def promote_job(job_id: str):
    principal = g.principal
    job = edits.promote(
        job_id, principal.owner, actor=principal.user_id, tenant_wide=principal.operator
    )
    return describe_full(job)


def _options(opts: SubmitOptions) -> JobOptions:
    """The job options, once the longest retry wait is known to fit in the delay quota."""
    options = JobOptions.model_validate(opts.model_dump(exclude_none=True))
    most = _max_delay_ms()
    backoff = options.backoff
    if backoff is not None and backoff_max_ms(backoff, max(1, options.attempts - 1)) > most:
        raise ApiError(
            400,
            f"the longest backoff wait must be at most {most // 1000} s",
            code="validation_failed",
            details=[
                {
                    "field": "opts.backoff",
                    "type": "value_error",
                    "limit": "maxDelaySeconds",
                    "max": most // 1000,
                }
            ],
        )
    return options


def submit_for(principal: Principal, body: SubmitJob, job_id: str | None = None) -> AddedJob:
    """Add ``body``'s job for ``principal`` under its tenant's quotas, for the API and the
    dashboard's add-job form (``web.ui.new_job``) alike."""
    load_job_modules()  # every job type declared, whichever this process imported so far
    submission = Submission(
        name=body.name, data=body.data, args=body.args, kwargs=body.kwargs, opts=_options(body.opts)
    )
    return submit(principal.owner, submission, quotas.current().jobs, job_id=job_id)


@operation(
    bp,
    "",
    "POST",
    summary="Add a job of a type tenants may submit (owned by the caller)",
    body=SubmitJob,
    responses={202: JobSubmitted, 400: None, 429: None},
    idempotent=True,
)
def submit_job(body: SubmitJob):
    principal = g.principal
    key = g.get("idempotency_key")  # a retry of this request finds the job it made
    job_id = job_id_for(principal.tenant_id, principal.user_id, key) if key else None
    added = submit_for(principal, body, job_id)
    return {
        "jobId": added.job_id,
        "accepted": True,
        "statusUrl": status_url(added.job_id),
        "state": added.state,
    }, 202
