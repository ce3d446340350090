"""A tenant's webhook endpoints: register, list, read, remove, and their deliveries (the
``keel.webhook.deliver`` jobs of an endpoint), sent again on request.

Registering checks the URL (``tasks.jobs.model.webhooks.check_url``) and makes the
endpoint's signing secret, shown once. Every worker takes a new or removed endpoint
into account within ``tasks.jobs.intake.webhook_events.REFRESH_S``.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Sequence
from typing import Any

from tasks.jobs.intake.enqueue import AddedJob, add
from tasks.jobs.intake.webhook_events import delivery_options
from tasks.jobs.model import webhooks
from tasks.jobs.model.errors import JobNotFound, QuotaExceeded, Refused
from tasks.jobs.model.models import JobRecord, WebhookEndpoint
from tasks.jobs.model.owner import Owner
from tasks.jobs.model.search import DataMatch
from tasks.jobs.store import jobs as jobs_store
from tasks.jobs.store import webhooks as store
from tasks.jobs.store.listing import JobFilter
from tasks.platform import quotas
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.platform.setting_types import parse_networks

MAX_ENDPOINTS = 20  # a tenant's endpoints


class EndpointNotFound(JobNotFound):
    """No such webhook endpoint (or not this tenant's)."""


def register(
    owner: Owner, url: str, events: Sequence[str], description: str | None
) -> WebhookEndpoint:
    """A new endpoint of ``owner``'s tenant; its secret is in the returned record only."""
    webhooks.check_url(url, parse_networks(get_settings().webhook_allow))
    unknown = sorted(set(events) - set(webhooks.EVENT_TYPES))
    if unknown or not events:
        raise Refused(f"events must be some of {', '.join(webhooks.EVENT_TYPES)}")
    endpoint = WebhookEndpoint(
        id=f"wh_{uuid.uuid4().hex}",
        tenant_id=owner.tenant_id,
        url=url,
        events=sorted(set(events)),
        secret=f"whsec_{secrets.token_urlsafe(32)}",
        description=description,
        created_by=owner.user_id,
    )
    with transaction() as session:
        if store.count(session, owner.tenant_id) >= MAX_ENDPOINTS:
            raise QuotaExceeded(
                f"a tenant has at most {MAX_ENDPOINTS} webhook endpoints",
                details=[{"quota": "webhookEndpoints", "limit": MAX_ENDPOINTS}],
            )
        store.add(session, endpoint)
        session.expunge(endpoint)
    return endpoint


def listed(tenant_id: str) -> list[WebhookEndpoint]:
    with transaction() as session:
        found = list(store.listed(session, tenant_id))
        session.expunge_all()
    return found


def get(tenant_id: str, endpoint_id: str) -> WebhookEndpoint:
    with transaction() as session:
        endpoint = store.get(session, tenant_id, endpoint_id)
        if endpoint is None:
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id}")
        session.expunge(endpoint)
    return endpoint


def remove(tenant_id: str, endpoint_id: str) -> None:
    """Remove it: no new deliveries; those still to be sent end failed at their next try."""
    with transaction() as session:
        if not store.remove(session, tenant_id, endpoint_id):
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id}")


def deliveries_of(tenant_id: str, endpoint_id: str) -> JobFilter:
    """The filter of an endpoint's delivery jobs (a job listing pages through them)."""
    get(tenant_id, endpoint_id)  # 404 for another tenant's
    match = DataMatch((json.dumps({"endpointId": endpoint_id}),))
    return JobFilter(tenant_id=tenant_id, name=webhooks.DELIVER, data=(match,))


def resend(owner: Owner, delivery_job_id: str) -> AddedJob:
    """Send one of the tenant's deliveries again, as a new delivery job (the first keeps its
    record): the same event, to its endpoint, with the same ``Keel-Webhook-Id`` for the
    receiver to recognise it. A delivery whose endpoint was removed is not found."""
    with transaction() as session:
        record = jobs_store.get(session, delivery_job_id)
        endpoint_id, event = _delivery_of(record, owner.tenant_id, delivery_job_id)
        if store.get(session, owner.tenant_id, endpoint_id) is None:
            raise JobNotFound(f"no delivery {delivery_job_id}")
    opts = delivery_options(f"{delivery_job_id}:again:{uuid.uuid4().hex[:12]}"[-200:])
    data = {"endpointId": endpoint_id, "event": event}
    # a tenant-facing door: the tenant's liveJobs quota applies (429 past it)
    limits = quotas.current().jobs
    return add(webhooks.DELIVER, data, queue=webhooks.QUEUE, opts=opts, owner=owner, limits=limits)


def _delivery_of(
    record: JobRecord | None, tenant_id: str, asked: str
) -> tuple[str, dict[str, Any]]:
    """The endpoint and event of a delivery job of ``tenant_id`` (any other: not found,
    exactly as a missing one)."""
    if record is None or record.tenant_id != tenant_id or record.name != webhooks.DELIVER:
        raise JobNotFound(f"no delivery {asked}")
    return str(record.data["endpointId"]), dict(record.data["event"])
