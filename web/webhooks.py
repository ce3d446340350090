"""``/api/v1/webhooks``: the operator's tenant's webhook endpoints, and their deliveries.

An endpoint takes event types of the tenant (``job.completed``, ``job.failed``,
``job.cancelled``, ``queue.paused``, ``queue.resumed``, ``campaign.finished``); each
delivery is a job (``keel.webhook.deliver``), signed with the endpoint's secret (shown
once, in the answer that registers it), retried with backoff until the endpoint answers
2xx; ``/<id>/deliveries`` lists an endpoint's as any job
listing, and ``/deliveries/<jobId>/resend`` sends one again. The rules:
``tasks.jobs.model.webhooks``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, get_args

from flask import Blueprint, g
from pydantic import BaseModel, ConfigDict, Field

from tasks.jobs.intake import webhooks as endpoints
from tasks.jobs.model.models import WebhookEndpoint
from tasks.jobs.model.webhooks import EVENT_TYPES, WebhookRefused
from tasks.jobs.observe.queries import DEFAULT_PAGE, MAX_PAGE, iso, list_jobs
from web.api import operation
from web.auth import OPERATOR
from web.errors import ApiError
from web.job_query import TEXT
from web.job_views import describe
from web.schemas import JobAccepted, JobList, Open, Strict

bp = Blueprint("webhooks", __name__, url_prefix="/api/v1/webhooks")
EventType = Literal[
    "job.completed",
    "job.failed",
    "job.cancelled",
    "queue.paused",
    "queue.resumed",
    "campaign.finished",
]
assert set(get_args(EventType)) == set(EVENT_TYPES)


class RegisterWebhook(Strict):
    url: str = Field(
        min_length=8,
        max_length=2000,
        pattern=r"^https?://[^\s]+$",
        description="http(s) URL; not this machine nor a private network unless an operator "
        "allowed it (KEEL_WEBHOOK_ALLOW)",
    )
    events: list[EventType] = Field(min_length=1, max_length=len(EVENT_TYPES))
    description: str | None = Field(default=None, min_length=1, max_length=500, pattern=TEXT)


class WebhookView(Open):
    id: str
    url: str
    events: list[str]
    description: str | None
    createdBy: str
    createdAt: datetime


class RegisteredWebhook(WebhookView):
    secret: str = Field(description="signs every delivery (Keel-Signature); shown only here")


class WebhookList(Open):
    webhooks: list[WebhookView]


class DeliveryQuery(BaseModel):
    """Paging of an endpoint's deliveries (query values are read laxly: ``limit=20``)."""

    model_config = ConfigDict(extra="forbid")

    cursor: str | None = Field(default=None, min_length=1, max_length=400, pattern=r"^[\w-]+$")
    limit: int = Field(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE)


def view(endpoint: WebhookEndpoint) -> dict:
    """An endpoint as the API and the dashboard show it: never its secret."""
    return {
        "id": endpoint.id,
        "url": endpoint.url,
        "events": endpoint.events,
        "description": endpoint.description,
        "createdBy": endpoint.created_by,
        "createdAt": iso(endpoint.created_at),
    }


@operation(
    bp,
    "",
    "POST",
    summary="Operator: register a webhook endpoint for event types of the tenant's jobs "
    "(its signing secret is in this answer only)",
    body=RegisterWebhook,
    role=OPERATOR,
    responses={201: RegisteredWebhook, 400: None, 403: None, 429: None},
)
def register_webhook(body: RegisterWebhook):
    try:
        endpoint = endpoints.register(g.principal.owner, body.url, body.events, body.description)
    except WebhookRefused as exc:
        raise ApiError(
            400,
            str(exc),
            code="validation_failed",
            details=[{"field": "url", "type": "webhook_url", "message": str(exc)}],
        ) from None
    return {**view(endpoint), "secret": endpoint.secret}, 201


@operation(
    bp,
    "",
    "GET",
    summary="Operator: the tenant's webhook endpoints",
    role=OPERATOR,
    responses={200: WebhookList, 403: None},
)
def list_webhooks():
    return {"webhooks": [view(e) for e in endpoints.listed(g.principal.tenant_id)]}


@operation(
    bp,
    "/<endpoint_id>",
    "GET",
    summary="Operator: one webhook endpoint",
    role=OPERATOR,
    responses={200: WebhookView, 403: None, 404: None},
)
def get_webhook(endpoint_id: str):
    return view(endpoints.get(g.principal.tenant_id, endpoint_id))


@operation(
    bp,
    "/<endpoint_id>",
    "DELETE",
    summary="Operator: remove a webhook endpoint (its deliveries not yet sent end failed)",
    role=OPERATOR,
    responses={204: None, 403: None, 404: None},
)
def remove_webhook(endpoint_id: str):
    endpoints.remove(g.principal.tenant_id, endpoint_id)
    return "", 204


@operation(
    bp,
    "/<endpoint_id>/deliveries",
    "GET",
    summary="Operator: an endpoint's deliveries (keel.webhook.deliver jobs), newest first, "
    "a page at a time: each one's state, attempts and failedReason",
    query=DeliveryQuery,
    role=OPERATOR,
    responses={200: JobList, 400: None, 403: None, 404: None},
)
def list_deliveries(endpoint_id: str, query: DeliveryQuery):
    where = endpoints.deliveries_of(g.principal.tenant_id, endpoint_id)
    page = list_jobs(where, cursor=query.cursor, limit=query.limit)
    jobs = [{**describe(job), "userId": job.user_id} for job in page.jobs]
    return {"jobs": jobs, "nextCursor": page.next_cursor}


@operation(
    bp,
    "/deliveries/<delivery_id>/resend",
    "POST",
    summary="Operator: send one of the tenant's webhook deliveries again, as a new delivery "
    "job (the same event and Keel-Webhook-Id, to its endpoint)",
    role=OPERATOR,
    responses={202: JobAccepted, 403: None, 404: None},
)
def resend_delivery(delivery_id: str):
    added = endpoints.resend(g.principal.owner, delivery_id)
    status_url = f"/api/v1/jobs/{added.job_id}"
    return {"jobId": added.job_id, "accepted": True, "statusUrl": status_url}, 202
