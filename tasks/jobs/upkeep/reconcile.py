"""Reconcile: a waiting job whose message left the broker gets a new one.

A waiting job's record stays in Postgres, but its message can go:
``celery -A tasks purge`` (or ``app.control.purge()``) deletes every message
of a queue, someone deletes a key, a worker dies between popping a message
and recording it as reserved. Nothing else would ever wake such a job.

Every ``KEEL_RECONCILE_INTERVAL_S`` (15 s), one worker looks at the waiting
jobs whose last publish is more than ``KEEL_RECONCILE_GRACE_S`` (10 s) old,
queue by queue, and republishes those the broker has no message for: not in
the queue's priority lists, not among the unacked copies kombu keeps in Redis
(a recorded job's message taken by a worker has none: ``tasks.platform.transport``;
so this is also what runs again a job whose worker died before claiming it), and
not named by a message or a live job as a task that runs after it (a chord
callback or a chain's next step, which Celery sends itself). The records are
read again just before, so a job claimed meanwhile is left alone; a
duplicate would be harmless anyway — a delivery runs only if it claims the
record. A job Celery has stored an outcome for (the callback of a chord that
failed) is left alone too.

**Bound.** With a worker running, a job whose message was purged is
republished at most grace + interval after the purge (25 s by default), and
runs once the jobs ahead of it on its queue have: "within a minute of a
purge" holds with room to spare for an idle queue.

The work is bounded: a queue holding more than ``MAX_MESSAGES`` messages is
not read (it is skipped that round, with a log line: a queue that full is
busy, not lost), and at most ``MAX_JOBS`` jobs of a queue are looked at per
round. A Redis key taken with ``SET NX`` gives each interval's round to one
worker, and a short Redis lock keeps two rounds (or a round and ``keel jobs
republish``) from overlapping.

**Not on RabbitMQ.** A RabbitMQ queue cannot be read without taking its
messages (AMQP has no "list"), and its message count cannot say *which*
waiting jobs lost theirs; republishing all of them is not harmless there:
a job that is waiting for a message Celery sends itself (a chord callback
counted by Celery, a campaign's fan-in) would run early. So with
``KEEL_BROKER_URL`` set no round runs, and ``keel jobs republish`` says why.
RabbitMQ loses messages only when told to (a purge, a deleted queue):
don't purge Keel's queues there.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from celery.backends.base import KeyValueStoreBackend

from tasks.jobs.intake.enqueue import republish
from tasks.jobs.model.errors import Refused, Unavailable
from tasks.jobs.observe import broker_contents
from tasks.jobs.observe.broker_contents import Contents, TooMany
from tasks.jobs.store import upkeep
from tasks.jobs.store.jobs import ReadyJob
from tasks.platform.broker import redis_client
from tasks.platform.celery_app import app
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

log = logging.getLogger(__name__)
MAX_MESSAGES = 20_000
MAX_JOBS = 5_000
ROUND_KEY = "keel:reconcile:round"
LOCK_KEY = "keel:reconcile:lock"
LOCK_S = 60  # longer than any bounded round; a worker that died holding it frees it then

_next_round = {"at": 0.0}


class Busy(Refused):
    """Another reconcile round is running."""

    code = "reconcile_busy"


class NotReadable(Unavailable):
    """The broker's queues cannot be read (RabbitMQ): Keel cannot tell which jobs lost a message."""

    code = "broker_not_readable"


def when_due() -> int | None:
    """The maintenance loop's call: one round if this worker's turn has come.

    Returns how many jobs were republished, ``None`` when no round ran here.
    Errors are logged, not raised: the rest of maintenance goes on.
    """
    settings = get_settings()
    if settings.broker_on_amqp or time.monotonic() < _next_round["at"]:
        return None
    _next_round["at"] = time.monotonic() + settings.reconcile_interval_s
    try:
        # Expires a little before this worker's next look, so the worker that ran the
        # last round always finds it free: rounds come every interval, whoever runs them.
        turn_ms = max(1, int(settings.reconcile_interval_s * 900))
        if not redis_client().set(ROUND_KEY, uuid.uuid4().hex, nx=True, px=turn_ms):
            return None
        return republish_lost(older_than_s=settings.reconcile_grace_s, wait_s=0)
    except Busy:
        return None
    except Exception:  # Redis or Postgres away: the next round tries again
        log.warning("reconciling waiting jobs with the broker failed", exc_info=True)
        return None


def republish_lost(queue: str | None = None, *, older_than_s: float, wait_s: float = 30) -> int:
    """Republish waiting jobs (of ``queue``, or every queue) that the broker has no message for.

    Only jobs whose last publish is at least ``older_than_s`` old are looked at.
    Waits up to ``wait_s`` for a round running elsewhere (``Busy`` after that).
    Returns how many jobs were republished; ``NotReadable`` on RabbitMQ.
    """
    if get_settings().broker_on_amqp:
        raise NotReadable(
            "the broker is RabbitMQ: its queues cannot be listed, so Keel cannot tell which "
            "waiting jobs lost their message (do not purge Keel's queues there)"
        )
    with _exclusive(wait_s):
        with transaction() as session:
            queues = [queue] if queue else upkeep.queues_with_waiting(session, older_than_s)
        if not queues:
            return 0
        try:
            reserved = broker_contents.unacked_contents(MAX_MESSAGES)
        except TooMany as exc:
            log.warning("reconcile round skipped: %s", exc)
            return 0
        return sum(_reconcile(name, older_than_s, reserved) for name in queues)


@contextmanager
def _exclusive(wait_s: float) -> Iterator[None]:
    lock = redis_client().lock(LOCK_KEY, timeout=LOCK_S, blocking_timeout=wait_s)
    if not lock.acquire(blocking=wait_s > 0):
        raise Busy("another reconcile round is running")
    try:
        yield
    finally:
        try:
            lock.release()
        except Exception:  # it lapsed or Redis went away: it expires by itself
            log.debug("reconcile lock not released", exc_info=True)


def _reconcile(queue: str, older_than_s: float, reserved: Contents) -> int:
    with transaction() as session:
        candidates = upkeep.waiting_since(session, queue, older_than_s, MAX_JOBS)
    if not candidates:
        return 0
    try:
        queued = broker_contents.queue_contents(queue, MAX_MESSAGES)
    except TooMany as exc:
        log.warning("reconcile skipped queue %s this round: %s", queue, exc)
        return 0
    missing = [j for j in candidates if not queued.holds(j.id) and not reserved.holds(j.id)]
    lost = _confirmed(missing)
    republish(lost)
    if lost:
        log.warning(
            "republished %d waiting jobs of queue %s that had no message in the broker",
            len(lost),
            queue,
        )
    return len(lost)


def _confirmed(missing: list[ReadyJob]) -> list[ReadyJob]:
    """Those still waiting now, that no live job's chord waits for and Celery has not settled."""
    if not missing:
        return []
    with transaction() as session:
        waiting = upkeep.still_waiting(session, [j.id for j in missing])
        chords = upkeep.chords_held(session)
    awaited = broker_contents.task_ids_in(chords)
    found = [j for j in missing if j.id in waiting and j.id not in awaited]
    settled = _settled_by_celery([j.id for j in found])
    return [j for j in found if j.id not in settled]


def _settled_by_celery(job_ids: list[str]) -> set[str]:
    """Jobs the result backend holds an outcome for: Celery decided they do not run."""
    backend = app.backend
    if not job_ids or not isinstance(backend, KeyValueStoreBackend):
        return set()
    values = backend.mget([backend.get_key_for_task(job_id) for job_id in job_ids])
    return {job_id for job_id, value in zip(job_ids, values, strict=True) if value}
