"""A run past its hard time limit is recorded as a failed run, "timed out after N s".

Celery's hard limit (``time_limit``: the task's, the call's, or ``task_time_limit``)
is kept by the prefork pool's *parent*: it kills the pool process running the task,
starts another, and calls ``Request.on_timeout`` there (on the worker's event loop).
Celery's own handler then marks the task failed (calling its ``link_error``
errbacks) and acknowledges the message. For a Keel job that was wrong twice: the
record was not told (the run stayed active until its lock ran out, then ran again
as *stalled*, and again, until the stalled rules failed it), and the errbacks fired
at every timeout, though the job was to run again.

``KeelRequest.on_timeout`` (``tasks.jobs.run.request``) records the end of the killed
run instead, through the path every failed run takes (``tasks.jobs.end.finish.failed``):
the job's attempts and backoff decide whether it runs again, and only a final failure
goes on to Celery's handling (errbacks, ``task_failure``, Flower's ``task-failed``). The
parent never saw the run's lock token, so the run is found by the worker's name and the
pool process's pid, which the claim writes in the run's entry
(``store.runs.active_run``); a run that had ended, or a job another worker took over, is
left as it is. The pool process is killed before the run is recorded (billiard kills it
only after this callback), so a retry never starts beside it. The database work is
bounded (``REQUEST_S``): the worker's event loop waits for it, and must not wait on a
hung Postgres; a run it could not record ends as stalled, as before.

The soft limit (``soft_time_limit``) needs nothing here: Celery raises
``SoftTimeLimitExceeded`` inside the handler, whose ending is the run's. (Should it land
in Keel's own code around the handler, between the claim and the handler or after the
handler returned, that run fails or stalls like a run that raised there.)

The threads and solo pools keep no time limits at all (Celery ignores them there), and
cannot stop a thread. There an ``async def`` handler's coroutine is stopped at its limits
(``tasks.jobs.run.aio``): cancelled at its await, its run fails with
``SoftTimeLimitExceeded`` at the soft one and, at the hard one, as timed out, through the
path every failed run takes, as prefork's kill is recorded. A sync run (or a coroutine
that blocks, or goes on past its cancel) that returns past its hard limit is failed as
timed out (``returned_late``), and its lock is not renewed past the limit
(``tasks.jobs.run.lock_renewal``): a run that hangs stalls, and the job runs again.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.exceptions import TimeLimitExceeded
from celery.signals import worker_process_init

from tasks.jobs.end import abort, finish
from tasks.jobs.store import runs
from tasks.platform.db import STORE_UNAVAILABLE, request_scope, transaction

log = logging.getLogger(__name__)

REQUEST_S = 2.0  # (the worker's event loop waits for it: a recorded end takes ~10 ms)

_pool_kills = False  # whether this process's runs are stopped at their hard limit
_PARENT_PID = os.getpid()  # imported before the pool forks (the job modules import it)


@worker_process_init.connect
def _in_a_prefork_pool_process(**_: Any) -> None:
    """A prefork pool's process: its pool's parent kills it at a hard limit. The solo pool
    sends this signal too, in the worker's own process, which nothing kills."""
    global _pool_kills
    _pool_kills = os.getpid() != _PARENT_PID


def seconds_text(seconds: float) -> str:
    """``2``, ``1.5``, ``1000000``: a limit as the record's reason says it."""
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:.3f}".rstrip("0")


def unenforced_limit(task: Any, request: Any) -> float | None:
    """The run's hard time limit where nothing stops a run at it (the threads and solo
    pools, where Celery ignores limits): the call's, else the task's (``task_time_limit``
    by default); ``None`` under prefork, or without one."""
    return _unenforced((request.timelimit or (None, None))[0] or task.time_limit)


def unenforced_soft_limit(task: Any, request: Any) -> float | None:
    """The run's soft time limit where Celery does not raise it (threads, solo): the
    call's, else the task's (``task_soft_time_limit`` by default); ``None`` under prefork,
    or without one."""
    return _unenforced((request.timelimit or (None, None))[1] or task.soft_time_limit)


def _unenforced(seconds: float | None) -> float | None:
    if _pool_kills:
        return None
    return float(seconds) if seconds else None


def returned_late(seconds: float, took: float) -> TimeLimitExceeded:
    """A run that passed its hard limit where the pool could not stop it: failed as it
    returns, saying so."""
    return TimeLimitExceeded(
        f"timed out after {seconds_text(seconds)} s (returned after {took:.1f} s: this pool "
        "cannot stop a run at its time limit)"
    )


def timed_out(seconds: float) -> TimeLimitExceeded:
    """Celery's own exception for the limit (what ``AsyncResult.get()`` raises), worded for
    the record."""
    return TimeLimitExceeded(f"timed out after {seconds_text(seconds)} s")


def record_timeout(job_id: str, worker: str, pid: int | None, seconds: float) -> bool | None:
    """Record the run of ``job_id`` by pool process ``pid`` of ``worker`` as failed, timed
    out: ``True`` when that failure is final, ``False`` when the job runs again, ``None``
    when there was no such run to end (it had ended, or was taken over) or the records
    could not be reached."""
    if pid is None:
        return None
    try:
        with request_scope(REQUEST_S):
            with transaction() as session:
                claimed = runs.active_run(session, job_id, worker, pid)
            if claimed is None:
                return None
            retrying = finish.failed(claimed, timed_out(seconds))
    except (finish.NotOurs, abort.Aborted):  # (aborted: it ended cancelled instead)
        return None
    except STORE_UNAVAILABLE as exc:
        log.warning("job %s timed out; its run could not be recorded yet: %s", job_id, exc)
        return None
    return retrying is None
