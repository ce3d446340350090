"""The claim: a delivery takes its job's record, or is let go without a run.

Celery delivers the message; the record decides. A delivery runs the handler only if it
can claim the record (waiting, or active with an expired lock), with a lock the run keeps
renewing (``tasks.jobs.run.lock_renewal``); any other delivery — a duplicate, a stale
redelivery, a job that already finished — is acknowledged and ignored. A message in a
format this worker does not read is left for one that does; a message sent without Keel
is recorded and claimed in one transaction; a paused queue's job is held, not claimed.
"""

from __future__ import annotations

import logging
import socket
import uuid
from typing import Any

from celery.exceptions import Ignore

from tasks.jobs.calls.celery_task import CeleryTask
from tasks.jobs.intake import pauses
from tasks.jobs.model import formats
from tasks.jobs.model.formats import KEEL_HEADER
from tasks.jobs.run import delivery
from tasks.jobs.store import pauses as pauses_store
from tasks.jobs.store import runs
from tasks.jobs.store.pauses import Hold
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform import tracing
from tasks.platform.config import get_settings
from tasks.platform.db import STORE_UNAVAILABLE, transaction

log = logging.getLogger(__name__)

# What a claim is made with: the job's id, the run's lock token, its duration, the worker.
Claim = tuple[str, str, float, str]


def claim(task: CeleryTask, args: Any, kwargs: Any) -> ClaimedJob:
    """The delivery's job, claimed for this run (its ``keel.claim`` span); else ``Ignore``."""
    with tracing.span("keel.claim", {"keel.job.id": task.request.id}) as span:
        claimed = _claimed(task, args, kwargs)
        span.set_attribute("keel.job.attempt", claimed.attempts_started)
        span.set_attribute("keel.job.stalled", claimed.stalled)
    return claimed


def _claimed(task: CeleryTask, args: Any, kwargs: Any) -> ClaimedJob:
    _refuse_unread_format(task)
    worker = task.request.hostname or socket.gethostname()
    made = (task.request.id, uuid.uuid4().hex, get_settings().lock_duration_s, worker)
    try:
        # A paused queue's job is held, not claimed (``tasks.jobs.intake.pauses``); a
        # recorded one was looked at already (``admission.hold_if_paused``).
        paused = pauses.queue_paused(delivery.queue(task))
        if delivery.recorded(task):  # a Keel message's record exists: its claim is one statement
            claimed = _claim_recorded(task, made, paused)
        else:
            claimed = _record_and_claim(task, made, paused, args, kwargs)
    except STORE_UNAVAILABLE as exc:
        delivery.requeue_while_store_unavailable(task, exc)
    if claimed is None:
        # Not ours to run: a duplicate delivery, or a job that finished. Say so to
        # Flower, which would otherwise show this delivery as started forever.
        delivery.announce_ignored(task, "the job's record is not waiting")
        raise Ignore()
    return claimed


def _refuse_unread_format(task: CeleryTask) -> None:
    """A release newer than this worker's wrote the message (``tasks.jobs.model.formats``):
    misread, it could run the wrong thing. Its record stays waiting for a worker that
    reads it."""
    header = getattr(task.request, KEEL_HEADER, None)
    if formats.reads_message(header):
        return
    log.error(
        "job %s: message format %r is not one this worker reads (%s); left waiting",
        task.request.id,
        header,
        sorted(formats.MESSAGE_FORMATS_READ),
    )
    delivery.announce_ignored(task, f"message format {header} is newer than this worker reads")
    raise Ignore()


def _claim_recorded(task: CeleryTask, made: Claim, paused: bool) -> ClaimedJob | None:
    claimed = runs.claim_alone(*made, delivery.canvas_context(task))
    if claimed is None and runs.await_insert(task.request.id):
        # The record may have been committed since the claim looked: a canvas
        # child is published inside the transaction that records it.
        if paused:
            delivery.ignore_if_held(task, pauses.hold(task.request.id))
        claimed = runs.claim_alone(*made, delivery.canvas_context(task))
    return claimed


def _record_and_claim(
    task: CeleryTask, made: Claim, paused: bool, args: Any, kwargs: Any
) -> ClaimedJob | None:
    """A message sent without Keel: recorded, then held or claimed, in one transaction."""
    with transaction() as session:
        delivery.record_on_arrival(task, session, args, kwargs)
        found = pauses_store.hold(session, task.request.id) if paused else Hold.RUN
        claimed = None
        if found is Hold.RUN:
            claimed = runs.claim(session, *made, delivery.canvas_context(task))
    delivery.ignore_if_held(task, found)
    return claimed
