"""The default retention: finished records are not kept for ever.

A job that sets ``removeOnComplete`` / ``removeOnFail`` keeps what its rule says (trimmed at
each of its ends, ``tasks.jobs.end.ending``; ``False`` keeps every record). A job that sets
neither — a Celery task's, unless it says otherwise — is deleted once finished longer ago
than a default age:

- completed: ``KEEL_KEEP_COMPLETED_S``; unset, Celery's ``result_expires`` (one day unless
  the app sets it), as Celery's own results expire;
- failed and cancelled: ``KEEL_KEEP_FAILED_S`` (seven days); a failed record goes to the
  failure archive (``failed_jobs_archive``) by the statement that deletes it.

``0`` (or ``result_expires = None``) keeps them for ever. Each round also deletes the queue
history's buckets past their time (``tasks.jobs.store.stats``); the history is counted as
jobs end, so a trimmed record is not missing from it. A deleted job reads as missing:
404 in the API, ``PENDING`` for ``AsyncResult``, as Celery's expired results do.

**Off the hot path.** No job's end pays for it: every ``KEEL_RETENTION_INTERVAL_S`` (60 s)
one worker's maintenance thread (a Redis ``SET NX`` gives each round to one worker) deletes
expired records in batches of ``BATCH``, oldest first, through partial indexes that hold
only the records this sweep may take, and skips rows another transaction holds. A round
stops after ``MAX_BATCHES`` batches, each its own transaction; if records are still due,
the next round follows ``CATCH_UP_S`` later (``when_due``), so a backlog (say, after the
ages were lowered) or a rate of finished jobs above a round's size per interval drains in
short transactions, with the maintenance loop's other work between rounds.

**Records from before this default.** The previous release stored ``removeOnComplete:
false`` on every job that set nothing (and in every scheduler template): those records are
kept for ever, as their option says; nothing can tell them from a job that asked for it.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

from tasks.jobs.intake import idempotency
from tasks.jobs.model.models import State
from tasks.jobs.store import stats, upkeep
from tasks.platform.broker import redis_client
from tasks.platform.celery_app import app
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

log = logging.getLogger(__name__)

ROUND_KEY = "keel:retention:round"
BATCH = 500
MAX_BATCHES = 20
# While records are still due, the next round comes this soon: the maintenance loop's other
# work (promotion, stalled checks, stopping aborted runs) gets its turns between rounds.
CATCH_UP_S = 1.0
# Deletes the round's key only if it is still this round's (another worker may hold it now).
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end"

_next_round = {"at": 0.0}


def default_ages() -> dict[State, int | None]:
    """How old a finished record without a rule of its own may get, per end (``None``: kept)."""
    settings = get_settings()
    completed: float | None
    if settings.keep_completed_s is not None:
        completed = settings.keep_completed_s
    else:
        expires = app.conf.result_expires
        completed = expires.total_seconds() if isinstance(expires, timedelta) else expires
    failed = settings.keep_failed_s
    return {
        State.COMPLETED: int(completed) if completed else None,
        State.FAILED: failed or None,
        State.CANCELLED: failed or None,
    }


def sweep() -> int:
    """One round: delete the records past their default age, at most ``MAX_BATCHES`` batches
    per end. Returns how many were deleted."""
    return _round()[0]


def _round() -> tuple[int, bool]:
    """A round's deletions, and whether it stopped with records still due (a full last
    batch after ``MAX_BATCHES``)."""
    removed, behind = 0, False
    for state, age_s in default_ages().items():
        if age_s is None:
            continue
        for _ in range(MAX_BATCHES):
            with transaction() as session:
                gone = upkeep.expire_finished(session, state, age_s, BATCH)
            removed += gone
            if gone < BATCH:
                break
        else:
            behind = True
    if removed:
        log.info("retention: deleted %d finished records past their default age", removed)
    with transaction() as session:  # the queue history's buckets past their time
        stats.prune(session)
    keys = idempotency.purge_expired(BATCH)  # Idempotency-Key answers past their time
    if keys:
        log.info("retention: deleted %d idempotency keys past their time", keys)
    return removed, behind or keys == BATCH


def when_due() -> int | None:
    """The maintenance loop's call: a round if its time has come and no other worker took it.

    A round that stops with records still due (more finished per interval than a round
    takes: ``BATCH`` times ``MAX_BATCHES`` per end) is followed by the next ``CATCH_UP_S``
    later, not an interval later, until one ends with none left: retention keeps up with
    rates far above a round per interval (up to what one thread deletes, 10,000 records
    a round), instead of falling behind by the difference every interval.

    Returns how many records went, ``None`` when no round ran here. Errors are logged, not
    raised: the rest of maintenance goes on, and the next round tries again.
    """
    interval_s = get_settings().retention_interval_s
    if time.monotonic() < _next_round["at"]:
        return None
    _next_round["at"] = time.monotonic() + interval_s
    try:
        turn_ms = max(1, int(interval_s * 900))  # free again before this worker looks next
        token = uuid.uuid4().hex
        if not redis_client().set(ROUND_KEY, token, nx=True, px=turn_ms):
            return None
        removed, behind = _round()
        if behind:  # the next round soon, here (another worker's would wait its turn)
            _next_round["at"] = time.monotonic() + min(CATCH_UP_S, interval_s)
            redis_client().eval(_RELEASE, 1, ROUND_KEY, token)
        return removed
    except Exception:  # Redis or Postgres away
        log.warning("the retention sweep failed", exc_info=True)
        return None
