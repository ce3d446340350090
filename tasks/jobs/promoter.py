"""A worker bootstep that publishes delayed jobs when they fall due.

Delayed jobs (the ``delay`` option, retry backoff, parked publishes) live in
Postgres, not in Celery ETA messages: nothing is held in worker memory, and
no broker visibility timeout can redeliver them early. Every worker runs a
promoter; ``FOR UPDATE SKIP LOCKED`` lets them share the work without
promoting a job twice.
"""

from __future__ import annotations

import logging
import threading

from celery import bootsteps

from tasks.config import get_settings
from tasks.db import transaction
from tasks.jobs import events, records
from tasks.jobs.producer import park_for_republish, publish

log = logging.getLogger(__name__)


def promote_once() -> int:
    """Publish every job that is due now; returns how many were published."""
    with transaction() as session:
        due = records.promote_due(session)
    failed: list[str] = []
    for job in due:
        try:
            publish(job.id, job.name, job.queue, job.data)
        except Exception:
            failed.append(job.id)
            continue
        events.emit(job.queue, "waiting", job.id, job.name)
    if failed:
        log.warning("broker unavailable; %d due jobs parked again", len(failed))
        park_for_republish(failed)
    return len(due) - len(failed)


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
        interval = get_settings().promote_interval_s
        while not self._stop.wait(interval):
            try:
                while promote_once() >= 200:
                    pass
            except Exception:
                log.warning("promoting delayed jobs failed; retrying", exc_info=True)
