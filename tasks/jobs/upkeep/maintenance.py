"""Maintenance: a worker bootstep that runs the job layer's periodic work.

In a thread of every worker's main process, every ``KEEL_PROMOTE_INTERVAL_S``: promote
due delayed jobs (``promote``) and notice a broker that lost its data
(``broker_reset``); every ``KEEL_STALLED_INTERVAL_S``: recover stalled jobs (``stalls``,
which cancels an aborted job's run instead), count the chord parts that stand for
another job once it ended (``canvas``), fold the state counters' pending deltas
(``store.counts``) and publish the jobs a lifted pause still holds (``pauses``); every
``KEEL_RETENTION_INTERVAL_S``: delete finished records past their default age
(``retention``; one worker per round); about every second: stop this worker's runs
aborted longer ago than ``KEEL_ABORT_GRACE_S`` (``termination``); every tick, a batch
of a running bulk action (``bulk_actions``; about every second while none runs).
Any number of workers run it at once; each piece is safe to share.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import bootsteps

from tasks.jobs.end import canvas, revocations, stalls
from tasks.jobs.intake import pauses, promote
from tasks.jobs.run import termination
from tasks.jobs.store import counts
from tasks.jobs.upkeep import broker_reset, bulk_actions, reconcile, retention
from tasks.platform.config import get_settings
from tasks.platform.db import passing

log = logging.getLogger(__name__)
Step = tuple[str, Callable[[], object]]  # what it does (for the log), and the call

BULK_IDLE_CHECK_S = 1.0  # how often an idle worker looks for a running bulk action


class Maintenance(bootsteps.StartStopStep):
    """Runs the periodic work of the job layer beside the worker's pool."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: Any = None

    def start(self, worker: Any) -> None:
        self._worker = worker
        self._thread = threading.Thread(target=self._loop, name="keel-maintenance", daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def terminate(self, worker: Any) -> None:
        """A cold shutdown stops the thread too (bootsteps call ``terminate``, not ``stop``)."""
        self.stop(worker)

    def _loop(self) -> None:
        settings = get_settings()
        next_stalled_check = next_abort_check = next_bulk_check = time.monotonic()
        bulk_busy = False
        while not self._stop.wait(settings.promote_interval_s):
            # Revoked jobs are cancelled first, and nothing that publishes runs while that
            # fails: a revoked job is never published (a worker started since the revoke
            # would not know it). The rest run apart: one that keeps failing must not hold
            # back the others; the database away stops the round at its first step.
            if _each(("cancelling revoked jobs", revocations.cancel_revoked)):
                steps = list(EVERY_TICK)
                if time.monotonic() >= next_stalled_check:
                    next_stalled_check = time.monotonic() + settings.stalled_interval_s
                    steps += EVERY_STALLED_CHECK
                _each(*steps)
            # A batch a tick while bulk actions run; else a look about every second.
            if bulk_busy or time.monotonic() >= next_bulk_check:
                next_bulk_check = time.monotonic() + BULK_IDLE_CHECK_S
                try:  # apart, as below: bulk work must not hold back the rest
                    bulk_busy = bulk_actions.work(batches=bulk_actions.MAINTENANCE_BATCHES) > 0
                except Exception:
                    bulk_busy = False
                    log.warning("bulk actions could not be worked; retrying", exc_info=True)
            if time.monotonic() >= next_abort_check:  # apart: it must not hold back the rest
                next_abort_check = time.monotonic() + termination.CHECK_INTERVAL_S
                try:
                    termination.stop_overdue(self._worker.hostname, self._worker.pool)
                except Exception:
                    log.warning("could not look for aborted runs; retrying", exc_info=True)


def _each(*steps: Step) -> bool:
    """Run each step; one that fails is logged and tried again at the next tick. The
    database away (or hung) ends the round there: every step needs it. Whether all worked."""
    worked = True
    for what, step in steps:
        try:
            step()
        except Exception as exc:  # a database blip must not stop maintenance
            log.warning("job maintenance: %s failed; retrying", what, exc_info=True)
            worked = False
            if passing(exc):
                break
    return worked


def _promote_all() -> None:
    while promote.promote_once() >= promote.BATCH:
        pass


def _release_unpaused() -> None:
    pauses.release_unpaused(batches=pauses.MAINTENANCE_BATCHES)


EVERY_TICK: tuple[Step, ...] = (
    ("promoting due jobs", _promote_all),
    ("checking the broker's epoch", broker_reset.check_epoch),
    ("reconciling records and messages", reconcile.when_due),
    ("trimming finished jobs", retention.when_due),
)
EVERY_STALLED_CHECK: tuple[Step, ...] = (
    ("requeueing stalled jobs", stalls.requeue_stalled_once),
    ("counting bound chord parts", canvas.count_bound_parts),
    ("compacting state counts", counts.compact),
    # What a resume left to publish (a big backlog, or it died midway), a few batches a
    # tick: the rest of this loop's upkeep does not wait on it.
    ("releasing resumed queues", _release_unpaused),
)
