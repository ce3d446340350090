"""Webhook endpoints of the operator's tenant: list, register, remove, and an endpoint's
deliveries, each one sent again on request.

Operators only, as in the API (``web.webhooks``). The form is turned into the body of
``POST /api/v1/webhooks``, validated by the same model (``RegisterWebhook``) and saved by
the same ``tasks.jobs.intake.webhooks.register``: a URL the API refuses (this machine, a
private network) is refused here with the same message. The endpoint's signing secret is
in the page that answers the form and nowhere else: not in a redirect's URL, not in the
session's cookie (signed, not encrypted), not on any later page. An endpoint's page lists
its deliveries (``keel.webhook.deliver`` jobs) a page at a time, as the API's
``/deliveries`` does, with **Send again** (``resend``, as ``POST
/api/v1/webhooks/deliveries/<jobId>/resend``).
"""

from __future__ import annotations

from typing import Any

from flask import flash, g, redirect, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from tasks.jobs.intake import webhooks as endpoints
from tasks.jobs.model.errors import JobNotFound, KeelError
from tasks.jobs.model.models import JobRecord, WebhookEndpoint
from tasks.jobs.model.webhooks import DELIVER, EVENT_TYPES, WebhookRefused
from tasks.jobs.observe.queries import list_jobs
from web.api import check_payload, validate, validate_query
from web.auth import OPERATOR, Principal
from web.errors import ApiError, status_of
from web.job_views import describe
from web.jobs import read_job
from web.ui import bp
from web.ui.forms import act, explained
from web.ui.session import signed_in
from web.webhooks import DeliveryQuery, RegisterWebhook, view

EMPTY_FORM = MultiDict({"events": "job.failed"})


def _listing(form: MultiDict, status: int = 200, **more: Any) -> Any:
    found = [view(e) for e in endpoints.listed(g.principal.tenant_id)]
    page = render_template(
        "ui/webhooks.html", webhooks=found, form=form, event_types=EVENT_TYPES, **more
    )
    return page, status


@bp.get("/webhooks")
@signed_in(OPERATOR)
def webhooks_page() -> Any:
    return _listing(EMPTY_FORM)


def _body(form: MultiDict) -> dict[str, Any]:
    """The API's body for the form (an empty description is none)."""
    body: dict[str, Any] = {"url": form.get("url", "").strip(), "events": form.getlist("events")}
    if form.get("description", "").strip():
        body["description"] = form["description"].strip()
    return body


def _register(principal: Principal, body: RegisterWebhook) -> WebhookEndpoint:
    """``register``, with a refused URL answered as the API answers it (400, its reason)."""
    try:
        return endpoints.register(principal.owner, body.url, body.events, body.description)
    except WebhookRefused as exc:
        raise ApiError(400, str(exc), code="validation_failed") from None


@bp.post("/webhooks")
@signed_in(OPERATOR)
def register_webhook() -> Any:
    """Register; the answer is the endpoint's page with its secret, this once (a refusal
    shows the form again with the reason)."""
    form = request.form
    try:
        body = validate(RegisterWebhook, check_payload(_body(form)))
        assert isinstance(body, RegisterWebhook)
        endpoint = _register(g.principal, body)
    except KeelError as refused:
        return _listing(form, status_of(refused), error=explained(refused))
    return render_template(
        "ui/webhook.html",
        endpoint=view(endpoint),
        secret=endpoint.secret,
        deliveries=[],
        query=DeliveryQuery(),
        next_cursor=None,
    )


def _delivery(job: JobRecord) -> dict[str, Any]:
    """A delivery's row: the job's status, and the event it carries (which job ended how)."""
    event = job.data.get("event") if isinstance(job.data, dict) else None
    event = event if isinstance(event, dict) else {}
    about = event.get("data")
    about_job = about.get("jobId") if isinstance(about, dict) else None
    return {**describe(job), "eventType": event.get("type"), "aboutJob": about_job}


@bp.get("/webhooks/<endpoint_id>")
@signed_in(OPERATOR)
def webhook(endpoint_id: str) -> Any:
    tenant = g.principal.tenant_id
    endpoint = endpoints.get(tenant, endpoint_id)  # another tenant's: 404, as in the API
    query = validate_query(DeliveryQuery)
    assert isinstance(query, DeliveryQuery)
    where = endpoints.deliveries_of(tenant, endpoint_id)
    page = list_jobs(where, cursor=query.cursor, limit=query.limit)
    return render_template(
        "ui/webhook.html",
        endpoint=view(endpoint),
        deliveries=[_delivery(job) for job in page.jobs],
        query=query,
        next_cursor=page.next_cursor,
    )


@bp.post("/webhooks/<endpoint_id>/remove")
@signed_in(OPERATOR)
def remove_webhook(endpoint_id: str) -> Any:
    endpoints.remove(g.principal.tenant_id, endpoint_id)  # a foreign id: 404, as in the API
    flash(f"Webhook endpoint {endpoint_id} removed.", "ok")
    return redirect(url_for("ui.webhooks_page"), 303)


@bp.post("/webhooks/deliveries/<delivery_id>/resend")
@signed_in(OPERATOR)
def resend_delivery(delivery_id: str) -> Any:
    """Send a delivery again; the outcome is shown on its endpoint's page."""
    principal = g.principal
    record = read_job(principal, delivery_id)  # another tenant's: 404, as a missing one
    endpoint_id = record.data.get("endpointId") if isinstance(record.data, dict) else None
    if record.name != DELIVER or not isinstance(endpoint_id, str):
        raise JobNotFound("job not found")  # not a delivery: as a missing one
    back = url_for("ui.webhook", endpoint_id=endpoint_id)
    return act(
        back,
        lambda: endpoints.resend(principal.owner, delivery_id),
        lambda added: f"Sent again: delivery job {added.job_id}.",
    )
