"""Recovering from a broker that lost its data (Redis restarted without persistence).

Waiting jobs are safe in Postgres but their messages were in Redis. Keel
keeps an epoch key in Redis; whoever finds it missing creates it (``SET
NX``: exactly one process wins) and republishes every waiting job the
broker holds no message for (one published since it came back is left
alone: on a fresh ``keel up``, beat's first job is often out first). A
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
from collections.abc import Callable

from tasks.jobs.intake.enqueue import republish
from tasks.jobs.observe import broker_contents
from tasks.jobs.observe.broker_contents import TooMany
from tasks.jobs.store import upkeep
from tasks.jobs.store.jobs import ReadyJob
from tasks.platform.broker import redis_client
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

log = logging.getLogger(__name__)
EPOCH_KEY = "keel:broker:epoch"
MAX_MESSAGES = 20_000  # per place read, as the reconciler's bound


def republish_waiting(batch: int = 500) -> int:
    """Publish a message for every waiting job the broker holds none for; returns how many.

    A job published since the broker came back (beat's first fire on a fresh
    ``keel up``, a job added meanwhile) has its message there already: sending
    another would only make a duplicate delivery, refused by the claim but
    logged. A message a worker holds is not in Redis (a recorded job's has no
    unacked copy: ``tasks.platform.transport``): its job gets a second message, which the
    claim refuses. Each goes behind its party's load, as an add's would.
    """
    count, last = 0, ""
    while True:
        with transaction() as session:
            page = upkeep.waiting_after(session, last, batch)
        if not page:
            return count
        held = _held(page)
        with transaction() as session:
            waiting = upkeep.still_waiting(session, [job.id for job in page])
        lost = [job for job in page if job.id in waiting and not held(job.id)]
        republish(lost)
        count += len(lost)
        last = page[-1].id


def _held(jobs: list[ReadyJob]) -> Callable[[str], bool]:
    """Whether the broker holds a message for a job; "no" for all when it holds too many to read."""
    try:
        queued = [broker_contents.queue_contents(q, MAX_MESSAGES) for q in {j.queue for j in jobs}]
        queued.append(broker_contents.unacked_contents(MAX_MESSAGES))
    except TooMany:  # a broker that full did not just lose everything: republish as before
        return lambda job_id: False
    return lambda job_id: any(job_id in contents.ids for contents in queued)


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
