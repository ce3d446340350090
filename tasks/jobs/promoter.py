"""A worker bootstep that publishes due delayed jobs and recovers stalled ones.

Delayed jobs (the ``delay`` option, retry backoff, parked publishes) live in
Postgres, not in Celery ETA messages: nothing is held in worker memory, and
no broker visibility timeout can redeliver them early. Every worker runs a
promoter; ``FOR UPDATE SKIP LOCKED`` lets them share the work without
promoting a job twice.

The same thread looks for stalled jobs (BullMQ's stalled checker): an
active job whose lock ran out — its worker died or hung — goes back to
waiting and is published again, or fails once it stalled more than
``KEEL_MAX_STALLED_COUNT`` times. It also notices a broker that lost its
data (``tasks.jobs.broker_reset``) and folds job-count deltas.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import bootsteps

from tasks import broker
from tasks.config import get_settings
from tasks.db import transaction
from tasks.jobs import broker_reset, counts, events, records, tenancy
from tasks.jobs.producer import park_for_republish, publish, publish_or_park

log = logging.getLogger(__name__)


def promote_once() -> int:
    """Publish every job that is due now; returns how many were published.

    After the first failed publish the rest are parked again without trying:
    each try against a hung broker costs its socket timeout, and a batch of
    them would hold this thread (and the stalled checks behind it) for long.
    """
    with transaction() as session:
        due = records.promote_due(session)
        priority = tenancy.priorities(session, [(j.id, j.tenant_id, j.queue) for j in due])
    failed: list[str] = []
    for job in due:
        if failed or broker.unreachable():
            failed.append(job.id)
            continue
        started = time.monotonic()
        try:
            publish(job.id, job.name, job.queue, job.data, job.celery_ctx,
                    priority=priority.get(job.id, 0))  # fmt: skip
        except Exception as exc:
            broker.failed(exc, started)
            failed.append(job.id)
            continue
        events.emit(job.queue, "waiting", job.id, job.name)
    if failed:
        log.warning("broker unavailable; %d due jobs parked again", len(failed))
        park_for_republish(failed)
    return len(due) - len(failed)


def requeue_stalled_once() -> int:
    """Recover every stalled job now; returns how many were found."""
    from tasks.jobs import lifecycle

    with transaction() as session:
        stalled = records.requeue_stalled(session, get_settings().max_stalled_count)
        for job in stalled:
            if job.state == "failed":
                lifecycle.on_finished(session, job, "failed")
    for job in stalled:
        events.emit(job.queue, "stalled", job.id, job.name)
        if job.state == "failed":
            events.emit(job.queue, "failed", job.id, job.name,
                        failedReason=records.STALLED_TOO_OFTEN)  # fmt: skip
        else:
            publish_or_park(job.id, job.name, job.queue, job.data, job.celery_ctx)
    return len(stalled)


class Promoter(bootsteps.StartStopStep):
    """Runs ``promote_once`` in a thread of the worker's main process."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, worker) -> None:
        self._thread = threading.Thread(target=self._loop, name="keel-promoter", daemon=True)
        self._thread.start()

    def stop(self, worker) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        settings = get_settings()
        next_stalled_check = time.monotonic()
        while not self._stop.wait(settings.promote_interval_s):
            try:
                while promote_once() >= 200:
                    pass
                broker_reset.check_epoch()
                if time.monotonic() >= next_stalled_check:
                    next_stalled_check = time.monotonic() + settings.stalled_interval_s
                    requeue_stalled_once()
                    counts.compact()
            except Exception:  # a database blip must not kill the promoter
                log.warning("promoting or stalled check failed; retrying", exc_info=True)
