"""A job's end, posted to its tenant's webhook endpoints (``tasks.jobs.intake.webhook_events``):
the delivery jobs are added in the transaction that records the end. A job whose tenant has
no endpoint for the event ends as before, its end recorded by one statement alone. Delivery
jobs end without events of their own (a delivery's end posting a delivery would never stop).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from tasks.jobs.intake import webhook_events
from tasks.jobs.model import webhooks


def _event_type(job: Any, state: str) -> str | None:
    return None if job.name == webhooks.DELIVER else f"job.{state}"


def wanted(job: Any, state: str) -> bool:
    """Whether ending ``job`` in ``state`` posts to an endpoint (then its end is recorded in
    a transaction, with the deliveries)."""
    event_type = _event_type(job, state)
    tenant = getattr(job, "tenant_id", None)
    return event_type is not None and bool(webhook_events.endpoints_for(tenant, event_type))


def announce(
    session: Session, job: Any, state: str, *, reason: str | None = None, result: Any = None
) -> None:
    """In the transaction that ends ``job``: its tenant's deliveries of ``job.<state>``."""
    event_type = _event_type(job, state)
    if event_type is None:
        return
    event = webhooks.job_event(job, state, reason=reason, result=result)
    # Each end is an occurrence of its own (a job retried by hand ends again): the guarded
    # statement that records the end commits once, and its deliveries with it.
    occurrence = f"{job.id}:{uuid.uuid4().hex}"
    tenant = getattr(job, "tenant_id", None)
    webhook_events.post(session, tenant, event_type, event["data"], occurrence)
