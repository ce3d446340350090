"""A job's end, for its tenant's webhook endpoints: one delivery job per endpoint that takes
the event, added in the transaction that records the end (``tasks.jobs.model.webhooks``).

Whether a tenant has endpoints is read from memory (``Subscriptions``), refreshed from
Postgres at most every ``REFRESH_S``: a job of a tenant without endpoints ends as before,
its end recorded by one statement alone; an endpoint registered (or removed) takes
effect on every worker within ``REFRESH_S``. Delivery jobs end without events of their
own (a delivery's end posting a delivery would never stop).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from tasks.jobs.intake.caller_transaction import in_transaction
from tasks.jobs.intake.enqueue import add
from tasks.jobs.model import webhooks
from tasks.jobs.model.options import Backoff, JobOptions
from tasks.jobs.model.owner import Owner
from tasks.jobs.store import webhooks as store
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

REFRESH_S = 2.0


@dataclass(frozen=True)
class Endpoint:
    id: str
    events: frozenset[str]
    creator: str | None


class Subscriptions:
    """Every tenant's endpoints, as this process last read them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = -REFRESH_S
        self._by_tenant: dict[str, list[Endpoint]] = {}

    def of(self, tenant_id: str) -> list[Endpoint]:
        with self._lock:
            if time.monotonic() - self._read_at >= REFRESH_S:
                self._by_tenant = self._read()
                self._read_at = time.monotonic()
            return self._by_tenant.get(tenant_id, [])

    def forget(self) -> None:
        """Read again at the next job's end (this process just changed an endpoint)."""
        with self._lock:
            self._read_at = -REFRESH_S

    @staticmethod
    def _read() -> dict[str, list[Endpoint]]:
        found: dict[str, list[Endpoint]] = {}
        with transaction() as session:
            for tenant, endpoint_id, events, creator in store.subscribed(session):
                found.setdefault(tenant, []).append(
                    Endpoint(endpoint_id, frozenset(events), creator)
                )
        return found


SUBSCRIPTIONS = Subscriptions()


def _endpoints(job: Any, event: str) -> list[Endpoint]:
    tenant = getattr(job, "tenant_id", None)
    if not tenant or job.name == webhooks.DELIVER:
        return []
    return [e for e in SUBSCRIPTIONS.of(tenant) if event in e.events]


def wanted(job: Any, state: str) -> bool:
    """Whether ending ``job`` in ``state`` posts to an endpoint (then its end is recorded in
    a transaction, with the deliveries)."""
    return bool(_endpoints(job, f"job.{state}"))


def delivery_options() -> JobOptions:
    settings = get_settings()
    backoff = Backoff(type="exponential", delay=settings.webhook_backoff_ms)
    return JobOptions(attempts=settings.webhook_attempts, backoff=backoff)


def announce(
    session: Session,
    job: Any,
    state: str,
    *,
    reason: str | None = None,
    result: Any = None,
) -> None:
    """In the transaction that ends ``job``: a delivery job for each endpoint of its tenant
    that takes ``job.<state>``, committed with the end or not at all."""
    endpoints = _endpoints(job, f"job.{state}")
    if not endpoints:
        return
    event = webhooks.job_event(job, state, reason=reason, result=result)
    created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    options = delivery_options()
    with in_transaction(session):
        for endpoint in endpoints:
            delivery = webhooks.delivery_id(endpoint.id, job.id, event["type"])
            add(
                webhooks.DELIVER,
                {"endpointId": endpoint.id, "event": {"id": delivery, **event, "at": created}},
                queue=webhooks.QUEUE,
                opts=options.model_copy(update={"job_id": delivery}),
                owner=Owner(job.tenant_id, endpoint.creator or "webhooks"),
            )
