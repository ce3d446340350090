"""An aborted run still going after the grace period is stopped by its worker.

``DELETE /api/v1/jobs/<id>`` of an active job asks for its run to be aborted
(``tasks.jobs.end.abort``); a handler that checks ``is_aborted()`` stops by itself. One
that does not is stopped here, ``KEEL_ABORT_GRACE_S`` after the request, by the worker
that runs it: each worker's maintenance thread (``tasks.jobs.upkeep.maintenance``) reads
the runs of its own (by the worker's name, written in each run's entry at claim) being
aborted for longer than that, about once a second.

Each stop holds the job's row locked (``runs.active_run(lock=True)``) from the moment it
finds the run still active until the job is recorded cancelled: the run cannot record its
own end meanwhile, so a run that ended just before is left alone, and the process killed
is the aborted run's, never one that went on to another job. Under the prefork pool the
run's pool process is killed (SIGKILL, as Celery's ``revoke(terminate=True)`` and its
hard time limit do) before the job is recorded cancelled, so nothing of it goes on once
the job reads ``cancelled``; the pool starts another process and the worker goes on
consuming. The pool then reports the process lost (``WorkerLostError``);
``KeelRequest.on_failure`` knows this stop (``was_stopped``) and acknowledges the
message, where Celery would requeue it (``reject_on_worker_lost``).

The threads and solo pools cannot stop a run. The job is cancelled all the same (its
lock token cleared, so nothing the run records later counts, and ``is_aborted()`` says
so), and the reason says the run may still be going. A run this worker does not hold
(its pool process was lost, or another worker shares its name) is left to the stalled
check, which cancels it once its lock runs out; so are a dead worker's runs.

A warm shutdown waits for running tasks after this check has stopped: a run that ignores
its abort then holds the shutdown until it returns (or the worker is stopped cold).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from celery.worker import state as worker_state

from tasks.jobs.end import abort
from tasks.jobs.run.timeouts import seconds_text
from tasks.jobs.store import runs
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # how often a worker looks for its overdue aborts
_FORGET_AFTER_S = 3600.0  # a kill whose lost process was never reported

# (job id, pool pid) of the runs this worker killed to abort them, and when: the process
# reported lost next is this stop's. Written by the maintenance thread, read by the
# worker's event loop.
_stopped: dict[tuple[str, int], float] = {}
_stopped_lock = threading.Lock()


def was_stopped(job_id: str, pid: int | None) -> bool:
    """Whether this worker killed pool process ``pid`` running ``job_id`` to abort it
    (once: forgotten as it is asked)."""
    with _stopped_lock:
        return _stopped.pop((job_id, pid or 0), None) is not None


def _note_stop(job_id: str, pid: int) -> None:
    now = time.monotonic()
    with _stopped_lock:
        for key, at in list(_stopped.items()):
            if now - at > _FORGET_AFTER_S:
                del _stopped[key]
        _stopped[(job_id, pid)] = now


def _kills(pool: Any) -> bool:
    """Whether ``pool`` runs each task in a process of its own that can be killed."""
    from celery.concurrency.prefork import TaskPool

    return isinstance(pool, TaskPool)


def stop_overdue(worker_name: str, pool: Any) -> list[str]:
    """Stop this worker's runs aborted longer ago than the grace period, and cancel their
    jobs; the ids it ended. One run that cannot be stopped does not hold back the others."""
    grace = get_settings().abort_grace_s
    with transaction() as session:
        overdue = runs.overdue_aborts(session, worker_name, grace)
    ended = []
    for job_id, pid in overdue:
        if pid is None:  # claimed by a release that did not note its pool process: it stalls
            continue
        try:
            if _stop(job_id, pid, worker_name, pool, grace):
                ended.append(job_id)
        except Exception:
            log.warning("could not stop aborted job %s yet", job_id, exc_info=True)
    return ended


def _stop(job_id: str, pid: int, worker_name: str, pool: Any, grace: float) -> bool:
    after = f"{seconds_text(grace)} s"
    with transaction() as session:
        # Locked: the run cannot record its end (and its process go on to another job)
        # between this check and the kill.
        claimed = runs.active_run(session, job_id, worker_name, pid, lock=True)
        if claimed is None:  # it ended meanwhile, by itself
            return False
        request = next((r for r in list(worker_state.active_requests) if r.id == job_id), None)
        if request is None or request.worker_pid != pid:
            return False  # not in this worker's hands: the stalled check's, once its lock lapses
        if _kills(pool):
            _note_stop(job_id, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # stopped first: nothing of it goes on
            reason = f"{abort.ABORTED}: its run was stopped after the {after} grace period"
        else:
            reason = (
                f"{abort.ABORTED}: its run did not stop within the {after} grace period, and "
                "this pool cannot stop it (what it does from now on is not recorded)"
            )
        done = abort.ended_run(session, claimed, reason)
    if done:
        log.warning("job %s aborted: %s", job_id, reason)
    return done
