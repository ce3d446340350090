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

A platform session (``web.ui.platform``) reads the list, a job's page, state and stream of
every tenant's jobs (the list with a tenant column and a ``tenant`` filter, which only it
takes), with no action offered; each of these views is audited.
"""

from __future__ import annotations

import re
from typing import Any

from flask import g, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from tasks.jobs.intake import edits
from tasks.jobs.model import registry
from tasks.jobs.model.errors import JobNotFound
from tasks.jobs.model.models import CANCELLABLE_STATES, STATES, JobRecord, State
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import job_logs, queries
from tasks.jobs.observe.flows import Flow, flow_of
from tasks.jobs.observe.queries import audit_trail, count_states, list_jobs
from web.api import check_payload, validate, validate_query
from web.auth import OPERATOR
from web.errors import ApiError
from web.events import stream_response
from web.job_query import JobListQuery, visible_to
from web.job_views import describe, describe_full
from web.jobs import cancel_for, read_job, retry_for
from web.schemas import RetryJob
from web.tokens import ID_RULE, is_id
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


def _tenant_filter(given: MultiDict) -> str | None:
    """The platform role's ``tenant`` filter (taken out of ``given``): one tenant's jobs of
    every tenant's. A tenant's session has no such filter (400, as any unknown field)."""
    if "tenant" not in given or not g.principal.platform:
        return None
    tenant = given.poplist("tenant")[-1]
    if not is_id(tenant):
        message = f"tenant must be an id ({ID_RULE})"
        detail = {"field": "tenant", "type": "id", "message": message}
        raise ApiError(
            400, "the query string is invalid", code="validation_failed", details=[detail]
        )
    return tenant


def _listing() -> dict[str, Any]:
    given = given_filters()
    tenant = _tenant_filter(given)
    query = validate_query(JobListQuery, given)
    assert isinstance(query, JobListQuery)
    where = visible_to(g.principal, query, tenant)
    page = list_jobs(where, cursor=query.cursor, limit=query.limit)
    if tenant is not None:
        given.add("tenant", tenant)
    filters = {k: v for k, v in given.to_dict().items() if k not in ("cursor", "limit")}
    return {
        "query": query,
        "tenant": tenant,
        "given": given.to_dict(),  # what the page's refresh asks for again
        "filters": filters,  # what the state links and the pager keep (data.<path> too)
        "form_time": {k: filters[k][:16] for k in TIME_FILTERS if k in filters},
        "jobs": [_row(job) for job in page.jobs],
        "next_cursor": page.next_cursor,
        "counts": count_states(where),
    }


def _row(job: JobRecord) -> dict[str, Any]:
    return {**describe(job), "userId": job.user_id, "tenantId": job.tenant_id}


def _read(job_id: str) -> JobRecord:
    """The job as the signed-in principal may see it: any tenant's for a platform session;
    else the API's owner-scoped read. Anything else is a missing job."""
    if not g.principal.platform:
        return read_job(g.principal, job_id)
    record = queries.get(job_id)
    if record is None:
        raise JobNotFound("job not found")
    return record


def _flow(record: JobRecord) -> Flow:
    """The jobs linked to ``record`` that the viewer may see (a flow stays in one tenant: the
    platform role sees the job's tenant's, as that tenant's operator would)."""
    principal = g.principal
    if not principal.platform:
        return flow_of(record, principal.owner, tenant_wide=principal.operator)
    if not record.tenant_id:
        return Flow()  # a system job's flow is the CLI's (keel jobs show)
    return flow_of(record, Owner(record.tenant_id, record.user_id or ""), tenant_wide=True)


@bp.get("/jobs")
@signed_in(reach="reads")
def jobs() -> Any:
    return render_template(
        "ui/jobs.html",
        **_listing(),
        queues=registry.queues(),
        names=registry.names(),
        states=STATES,
    )


@bp.get("/jobs/table")
@signed_in(reach="reads")
def jobs_table() -> Any:
    """The list's counts, rows and pager alone, for the page's auto-refresh."""
    return render_template("ui/_jobs_table.html", **_listing())


@bp.get("/jobs/<job_id>")
@signed_in(reach="reads")
def job(job_id: str) -> Any:
    record = _read(job_id)
    acts = not g.principal.platform  # the platform role reads only
    log_lines, written = job_logs.newest(record.id, JOB_PAGE_LOG_LINES)
    return render_template(
        "ui/job.html",
        job=describe_full(record),
        log_lines=log_lines,
        log_written=written,
        stacktrace=record.stacktrace,
        audits=audit_trail(record.id),
        flow=_flow(record),
        tenant_id=record.tenant_id,
        acts=acts,
        cancellable=acts and record.state in CANCELLABLE_STATES,
        abortable=acts and record.state == State.ACTIVE and record.abort_requested_at is None,
        promotable=acts and record.state == State.DELAYED,
        retryable=acts and record.state == State.FAILED,
    )


@bp.get("/jobs/<job_id>/state")
@signed_in(reach="reads")
def job_state(job_id: str) -> Any:
    """The job's status as the API shows it (what the page's script refreshes from)."""
    return describe(_read(job_id))


@bp.get("/jobs/<job_id>/events")
@signed_in(reach="reads")
def job_events(job_id: str) -> Any:
    return stream_response(_read(job_id), STREAM_TIMEOUT_S)


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
