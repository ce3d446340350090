"""Promote: delayed jobs whose time has come become waiting, and get their message.

Delayed jobs (the ``delay`` option, retry backoff, deferrals, parked
publishes) live in Postgres, not in Celery ETA messages: nothing is held in
worker memory, and no broker visibility timeout can redeliver them early.
Every worker promotes (``tasks.jobs.upkeep.maintenance``); ``FOR UPDATE SKIP LOCKED``
lets them share the work without promoting a job twice.

The messages are published *inside* the promoting transaction, before it
commits. A worker that receives one waits on the row lock, then finds the job
waiting and claims it. Published after the commit instead, a promoter killed
in between would leave a waiting job with no message, stranded. Published
before a commit that then fails, a message finds its job still delayed and is
ignored; the job is promoted again later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from tasks.jobs.intake import tenancy
from tasks.jobs.intake.messages import Message, announce, messages_for, publish_all
from tasks.jobs.observe import events
from tasks.jobs.store import upkeep
from tasks.jobs.store.jobs import NewJob, ReadyJob
from tasks.platform import broker
from tasks.platform.celery_app import app
from tasks.platform.db import transaction

log = logging.getLogger(__name__)
# A job that just became waiting; a bulk add's own records are sent as they are.
Ready = TypeVar("Ready", ReadyJob, NewJob)
BATCH = 200
PARK_S = 1.0


def publish_ready(
    session: Session, jobs: Sequence[Ready], *, announce_waiting: bool = False
) -> list[Ready]:
    """Publish jobs that just became waiting in ``session``'s transaction; returns those sent.

    After the first failed publish the rest are parked again (in the same
    transaction) without trying: each try against a hung broker costs its
    socket timeout, and a batch of them would hold the promoter for long.

    ``announce_waiting``: the jobs' ``waiting`` events go out here, before ``session``
    commits (the promoter's, a caller transaction's, a lifted pause's): a worker cannot
    claim a job before that commit, so its ``active`` always follows its ``waiting`` (sent
    after the commit, a fast worker's came first). A commit that then fails leaves an
    event for a job that is not waiting, announced again when it is sent (by the promoter,
    or by the next release of a pause): a reader may see a job's ``waiting`` twice.
    """
    priority = tenancy.priorities(session, [(j.id, j.tenant_id, j.queue, j.priority) for j in jobs])
    sent: list[Ready] = []
    started = time.monotonic()
    batched = True
    refused: dict[str, str] = {}
    building = False
    try:
        parent = app.current_worker_task  # the same for every message of the batch
        # One producer (one pooled connection) for the batch, not one acquired per job.
        with app.producer_or_acquire() as producer:
            unreachable = broker.publish_unreachable()
            building = True
            messages = [] if unreachable else messages_for(jobs, priority, parent, refused)
            building = False
            if refused:  # no message can be built from them: set aside, the rest go
                jobs = [job for job in jobs if job.id not in refused]
            started = time.monotonic()
            if messages and publish_all(producer, messages):  # Redis: one pipeline for all
                sent = list(jobs)
            elif messages:  # RabbitMQ: each at once
                batched = producer.supports_batch_publish
                _publish_each(producer, jobs, messages, sent)
    except Exception as exc:
        if building:  # not the broker's doing: nothing was sent, the batch is parked
            log.exception("the messages of %d jobs could not be built", len(jobs))
        else:
            # A pipeline's failure says when its round trip began: building a big batch's
            # messages before it is no sign of a hung broker.
            broker.publish_failed(exc, getattr(exc, "started", started))
        if batched:
            # A failed batch may have sent any part of itself: every job of it is parked.
            # A message that did go out finds its record delayed and is ignored (the
            # claim runs waiting jobs only); the promoter sends the job again when due.
            sent = []
    if refused:
        _set_aside(session, refused)
    unsent = [job.id for job in jobs[len(sent) :]]
    if unsent:
        log.warning("broker unavailable; %d jobs parked again", len(unsent))
        upkeep.park(session, unsent, PARK_S)
    if announce_waiting:
        events.emit_many([(job.queue, "waiting", job.id, job.name, job.tenant_id) for job in sent])
    return sent


#: How long a job whose message cannot be built waits before it is tried again.
REFUSED_PARK_S = 3600.0


def _set_aside(session: Session, refused: dict[str, str]) -> None:
    """Jobs whose message cannot be built from their records (data that is not an object,
    recorded by an earlier release's ``add``): due again in an hour, and said loudly, so
    that an operator fixes or cancels them; the jobs published with them are not held."""
    upkeep.park(session, list(refused), REFUSED_PARK_S)
    for job_id, reason in refused.items():
        log.error(
            "job %s: no message can be built from its record (%s); tried again in %.0f s: "
            "edit its data (PUT /api/v1/jobs/<id>/data) or cancel it",
            job_id,
            reason,
            REFUSED_PARK_S,
        )


def _publish_each(
    producer: Any, jobs: Sequence[Ready], messages: Sequence[Message], sent: list[Ready]
) -> None:
    """Publish through kombu's producer, one message after another (in its publish batch
    where the transport has one), then their task-sent events; each job sent is added to
    ``sent`` as it goes (a failure raises, and those before it count)."""
    events_due: list[dict[str, Any]] = []
    with producer.batch():
        for job, message in zip(jobs, messages, strict=True):
            if broker.publish_unreachable():
                break
            broker.publish(message.publish, producer)
            sent.append(job)
            if message.sent is not None:
                events_due.append(message.sent)
        if events_due:
            announce(producer, events_due)


def promote_once() -> int:
    """Promote and publish every job that is due now (one batch); returns how many were due."""
    with transaction() as session:
        due = upkeep.promote_due(session, BATCH)
        publish_ready(session, due, announce_waiting=True)
    return len(due)
