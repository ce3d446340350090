"""Statements on ``webhook_endpoints``: a tenant's endpoints (``tasks.jobs.model.webhooks``
says what they are for). Every read and change but ``subscribed`` names the tenant."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from tasks.jobs.model.models import WebhookEndpoint


def add(session: Session, endpoint: WebhookEndpoint) -> WebhookEndpoint:
    session.add(endpoint)
    session.flush()
    return endpoint


def count(session: Session, tenant_id: str) -> int:
    query = select(WebhookEndpoint.id).where(WebhookEndpoint.tenant_id == tenant_id)
    return len(session.scalars(query).all())


def listed(session: Session, tenant_id: str) -> Sequence[WebhookEndpoint]:
    query = (
        select(WebhookEndpoint)
        .where(WebhookEndpoint.tenant_id == tenant_id)
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
    )
    return session.scalars(query).all()


def get(session: Session, tenant_id: str | None, endpoint_id: str) -> WebhookEndpoint | None:
    """One endpoint; ``tenant_id`` None: whoever's (a delivery reads its own endpoint)."""
    query = select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id)
    if tenant_id is not None:
        query = query.where(WebhookEndpoint.tenant_id == tenant_id)
    return session.scalars(query).first()


def remove(session: Session, tenant_id: str, endpoint_id: str) -> bool:
    gone = session.execute(
        delete(WebhookEndpoint)
        .where(WebhookEndpoint.tenant_id == tenant_id, WebhookEndpoint.id == endpoint_id)
        .returning(WebhookEndpoint.id)
    ).first()
    return gone is not None


def subscribed(session: Session) -> Sequence[tuple[str, str, list[str], str | None]]:
    """``(tenant, endpoint id, event types, creator)`` of every endpoint: what a worker keeps
    in memory to know, as each job ends, whether its tenant takes the event."""
    query = select(
        WebhookEndpoint.tenant_id,
        WebhookEndpoint.id,
        WebhookEndpoint.events,
        WebhookEndpoint.created_by,
    )
    return [(t, i, list(e), c) for t, i, e, c in session.execute(query).all()]
