"""Posting a tenant's events to its webhook endpoints: one delivery job per endpoint that
takes the event, added in the caller's transaction — the one that records what the event
says (a job's end, a queue's pause, a campaign's report): committed with it or not at all
(``tasks.jobs.model.webhooks``).

Whether a tenant has endpoints is read from memory (``Subscriptions``), refreshed from
Postgres at most every ``REFRESH_S``: an event of a tenant without endpoints costs no
statement; an endpoint registered (or removed) takes effect in every process within
``REFRESH_S``.
"""

from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)
REFRESH_S = 2.0


@dataclass(frozen=True)
class Endpoint:
    id: str
    events: frozenset[str]
    creator: str | None


class Subscriptions:
    """Every tenant's endpoints, as this process last read them.

    One thread reads at a time, without holding the copy's readers up: while it reads, the
    others use the copy they have (at most ``REFRESH_S`` old). Only the first read of a
    process makes the others wait for it (no copy yet: an event must not be taken for one
    without endpoints). A failed read keeps the last copy and is tried again ``REFRESH_S``
    later; a failed first read fails the event's transaction, as Postgres away would.
    """

    def __init__(self) -> None:
        self._reading = threading.Lock()
        self._read_at = -REFRESH_S
        self._by_tenant: dict[str, list[Endpoint]] | None = None

    def of(self, tenant_id: str) -> list[Endpoint]:
        if self._by_tenant is None:
            with self._reading:  # the first read: wait for it
                if self._by_tenant is None:
                    self._by_tenant = self._read()
                    self._read_at = time.monotonic()
        elif time.monotonic() - self._read_at >= REFRESH_S and self._reading.acquire(False):
            try:
                self._by_tenant = self._read()
            except Exception:
                log.warning(
                    "could not read the webhook endpoints; using the last copy", exc_info=True
                )
            finally:
                self._read_at = time.monotonic()
                self._reading.release()
        return self._by_tenant.get(tenant_id, [])

    def forget(self) -> None:
        """Read again at the next event (this process just changed an endpoint)."""
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


def endpoints_for(tenant_id: str | None, event_type: str) -> list[Endpoint]:
    """The tenant's endpoints that take ``event_type`` (none for the system's events)."""
    if not tenant_id:
        return []
    return [e for e in SUBSCRIPTIONS.of(tenant_id) if event_type in e.events]


def delivery_options(delivery_id: str | None = None) -> JobOptions:
    settings = get_settings()
    backoff = Backoff(type="exponential", delay=settings.webhook_backoff_ms)
    return JobOptions(attempts=settings.webhook_attempts, backoff=backoff, job_id=delivery_id)


def post(
    session: Session, tenant_id: str | None, event_type: str, data: dict[str, Any], source: str
) -> int:
    """In the transaction that records what the event says: a delivery job for each of the
    tenant's endpoints that take ``event_type``; how many. ``source`` names the occurrence
    (a job's id; a pause's own id): one delivery per endpoint and occurrence."""
    endpoints = endpoints_for(tenant_id, event_type)
    if not endpoints or tenant_id is None:
        return 0
    at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    with in_transaction(session):
        for endpoint in endpoints:
            delivery = webhooks.delivery_id(endpoint.id, source, event_type)
            event = {"id": delivery, "type": event_type, "data": data, "at": at}
            add(
                webhooks.DELIVER,
                {"endpointId": endpoint.id, "event": event},
                queue=webhooks.QUEUE,
                opts=delivery_options(delivery),
                owner=Owner(tenant_id, endpoint.creator or "webhooks"),
            )
    return len(endpoints)
