"""Recovering from a broker that lost its data (Redis restarted without persistence).

Waiting jobs are safe in Postgres but their messages were in Redis. Keel
keeps an epoch key in Redis; whoever finds it missing creates it (``SET
NX``: exactly one process wins) and republishes every waiting job. A
republished message for a job that already ran, or runs twice, is harmless:
a delivery runs the handler only if it can claim the record, and completed
jobs are never claimable. Delayed jobs live in Postgres and need nothing.

On RabbitMQ (``KEEL_BROKER_URL``) there is nothing to check: Keel's queues
are durable quorum queues, whose messages a broker restart keeps (on disk,
and on a majority of nodes), and Keel's Redis losing its data says nothing
about them — republishing every waiting job then would only add duplicates.
"""

from __future__ import annotations

import logging
import uuid

from tasks.broker import redis_client
from tasks.config import get_settings
from tasks.db import transaction
from tasks.jobs.enqueue import publish_or_park
from tasks.jobs.store import upkeep

log = logging.getLogger(__name__)
EPOCH_KEY = "keel:broker:epoch"


def republish_waiting(batch: int = 500) -> int:
    """Publish a message for every waiting job; returns how many."""
    count, last = 0, ""
    while True:
        with transaction() as session:
            page = upkeep.waiting_after(session, last, batch)
        if not page:
            return count
        for job in page:
            publish_or_park(job.id, job.name, job.queue, job.data, job.celery_ctx)
        count += len(page)
        last = page[-1].id


def check_epoch() -> bool:
    """If the broker's epoch is gone, claim a new one and republish; ``True`` if we did."""
    if get_settings().broker_on_amqp:
        return False
    client = redis_client()
    if client.exists(EPOCH_KEY):
        return False
    if not client.set(EPOCH_KEY, uuid.uuid4().hex, nx=True):
        return False  # another process is recovering
    republished = republish_waiting()
    if republished:
        log.warning("broker epoch was missing: republished %d waiting jobs", republished)
    return True
