"""Jobs: the list (filters, pages, counts per state, auto-refresh) and one job's page.

The list reads the same query string as ``GET /api/v1/jobs`` (``queue``,
``state``, ``name``, the search's ``data``, ``data.<path>``, ``idPrefix``, times and
``error``, ``cursor``, ``limit``), validated by the same model, except that an empty
value means "any" (the filter form sends ``queue=`` for its "any" choice) and a time
without an offset is UTC (the form's time fields send none); a page refreshes its table
from ``/ui/jobs/table`` with that query. A job's page follows the job live: the script
listens to the job's event stream (``web.events``, the queue's Redis stream) and, on
each event, reads the job's record from ``/ui/jobs/<id>/state`` — the record, not the
event, is what the page shows. Its "Flow" (``tasks.jobs.observe.flows``) shows the jobs
linked to it — parent and children, its chain's steps, its chord's parts and body — that
the viewer may see.

Retry (operators) and Cancel call the API's ``retry_for`` and ``cancel_for``;
a refusal (409 conflict, 400 invalid state or reason) comes back as the
API's message above the job.
"""

from __future__ import annotations

import re
from typing import Any

from flask import g, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from tasks.jobs.intake import edits
from tasks.jobs.model import registry
from tasks.jobs.model.models import CANCELLABLE_STATES, STATES, JobRecord, State
from tasks.jobs.observe import job_logs
from tasks.jobs.observe.flows import flow_of
from tasks.jobs.observe.queries import audit_trail, count_states, list_jobs
from web.api import check_payload, validate, validate_query
from web.auth import OPERATOR
from web.events import stream_response
from web.job_query import JobListQuery, visible_to
from web.job_views import describe, describe_full
from web.jobs import cancel_for, read_job, retry_for
from web.schemas import RetryJob
from web.ui import bp
from web.ui.forms import act
from web.ui.session import signed_in

STREAM_TIMEOUT_S = 120.0  # then the browser reconnects with Last-Event-ID
JOB_PAGE_LOG_LINES = 100  # the newest lines of its log a job's page shows


# A browser's datetime-local field sends a time without an offset: the form says it is UTC.
_LOCAL_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d{1,6})?)?")
TIME_FILTERS = ("createdFrom", "createdTo", "finishedFrom", "finishedTo")


def given_filters() -> MultiDict:
    """The query string without its empty values: the filter form's "any" sends ``queue=``;
    a time without an offset, from the form's time fields, is read as UTC."""
    given: MultiDict = MultiDict()
    for name, value in request.args.items(multi=True):
        if value:
            local = _LOCAL_TIME.fullmatch(value) if name in TIME_FILTERS else None
            if local is not None:  # to RFC 3339, as the API takes it: seconds, and UTC
                value = f"{value}{'' if local.group(1) else ':00'}Z"
            given.add(name, value)
    return given


def _listing() -> dict[str, Any]:
    given = given_filters()
    query = validate_query(JobListQuery, given)
    assert isinstance(query, JobListQuery)
    where = visible_to(g.principal, query)
    page = list_jobs(where, cursor=query.cursor, limit=query.limit)
    filters = {k: v for k, v in given.to_dict().items() if k not in ("cursor", "limit")}
    return {
        "query": query,
        "given": given.to_dict(),  # what the page's refresh asks for again
        "filters": filters,  # what the state links and the pager keep (data.<path> too)
        "form_time": {k: filters[k][:16] for k in TIME_FILTERS if k in filters},
        "jobs": [_row(job) for job in page.jobs],
        "next_cursor": page.next_cursor,
        "counts": count_states(where),
    }


def _row(job: JobRecord) -> dict[str, Any]:
    return {**describe(job), "userId": job.user_id}


@bp.get("/jobs")
@signed_in()
def jobs() -> Any:
    return render_template(
        "ui/jobs.html",
        **_listing(),
        queues=registry.queues(),
        names=registry.names(),
        states=STATES,
    )


@bp.get("/jobs/table")
@signed_in()
def jobs_table() -> Any:
    """The list's counts, rows and pager alone, for the page's auto-refresh."""
    return render_template("ui/_jobs_table.html", **_listing())


@bp.get("/jobs/<job_id>")
@signed_in()
def job(job_id: str) -> Any:
    record = read_job(g.principal, job_id)
    log_lines, written = job_logs.newest(record.id, JOB_PAGE_LOG_LINES)
    return render_template(
        "ui/job.html",
        job=describe_full(record),
        log_lines=log_lines,
        log_written=written,
        stacktrace=record.stacktrace,
        audits=audit_trail(record.id),
        flow=flow_of(record, g.principal.owner, tenant_wide=g.principal.operator),
        cancellable=record.state in CANCELLABLE_STATES,
        abortable=record.state == State.ACTIVE and record.abort_requested_at is None,
        promotable=record.state == State.DELAYED,
        retryable=record.state == State.FAILED,
    )


@bp.get("/jobs/<job_id>/state")
@signed_in()
def job_state(job_id: str) -> Any:
    """The job's status as the API shows it (what the page's script refreshes from)."""
    return describe(read_job(g.principal, job_id))


@bp.get("/jobs/<job_id>/events")
@signed_in()
def job_events(job_id: str) -> Any:
    return stream_response(read_job(g.principal, job_id), STREAM_TIMEOUT_S)


@bp.post("/jobs/<job_id>/retry")
@signed_in(OPERATOR)
def retry_job(job_id: str) -> Any:
    def retry() -> None:
        body = validate(RetryJob, check_payload({"reason": request.form.get("reason", "")}))
        assert isinstance(body, RetryJob)
        retry_for(g.principal, job_id, body.reason)

    return act(url_for("ui.job", job_id=job_id), retry, "Retried: the job runs again.")


@bp.post("/jobs/<job_id>/promote")
@signed_in()
def promote_job(job_id: str) -> Any:
    principal = g.principal
    return act(
        url_for("ui.job", job_id=job_id),
        lambda: edits.promote(
            job_id, principal.owner, actor=principal.user_id, tenant_wide=principal.operator
        ),
        "Promoted: the job waits to run now.",
    )


@bp.post("/jobs/<job_id>/cancel")
@signed_in()
def cancel_job(job_id: str) -> Any:
    """Cancel a job that has not run, or abort the run of an active one (as the API does)."""
    return act(
        url_for("ui.job", job_id=job_id),
        lambda: cancel_for(g.principal, job_id),
        lambda done: (
            "Aborting: the job ends cancelled once its run stops."
            if done.aborting
            else "Cancelled: the job will not run."
        ),
    )
