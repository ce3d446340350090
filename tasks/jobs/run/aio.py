"""``async def`` tasks and handlers: each runs to its end on an event loop of its thread.

A worker's pool slot runs one job at a time, async or not: the coroutine runs on the
event loop of the thread that runs the job (a prefork pool process's, or each thread's of
a ``-P threads`` pool), made once per thread and kept. So, with ``-P threads -c 100``, a
hundred async jobs await at once in one process; with prefork, one per process, as a
sync job would. Everything Keel does for a sync job holds: retries (``autoretry_for``,
``self.retry``, the job's backoff), time limits (Celery's, which stop the thread's loop),
``Defer``, job logs and progress (short synchronous calls). An abort cancels the coroutine
at the await it is in (``asyncio.CancelledError`` there; the job ends ``cancelled``): a
watcher beside it asks the record every ``POLL_S``.

``async_run(fun)`` is what Keel's app makes of an ``async def`` task function
(``tasks.assembly``): a function that runs it, so Celery's ``autoretry_for`` sees its
errors as a sync function's.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from celery import current_task

from tasks.jobs.end.abort import ABORTED, Aborted
from tasks.jobs.store import runs
from tasks.jobs.store.runs import ClaimedJob

POLL_S = 0.5  # how often a running coroutine's record is asked whether it is being aborted

_thread = threading.local()


def loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, made on first use and kept for the thread's next jobs."""
    current: asyncio.AbstractEventLoop | None = getattr(_thread, "loop", None)
    if current is None or current.is_closed():
        current = _thread.loop = asyncio.new_event_loop()
    return current


def run(awaitable: Awaitable[Any], claimed: ClaimedJob | None = None) -> Any:
    """Run ``awaitable`` to its end on this thread's loop; its result, or its error.

    ``claimed``: the run's claim, watched for an abort (the current job's, if not given).
    """
    claimed = claimed or _current_claim()
    here = loop()
    try:
        return here.run_until_complete(_watched(awaitable, claimed))
    except BaseException:
        _settle(here)  # a time limit can stop the loop mid-run: nothing of this job lingers
        raise


def async_run(fun: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """A sync function that runs ``fun``'s coroutine (``run``), with ``fun``'s signature."""

    @functools.wraps(fun)
    def run_coroutine(*args: Any, **kwargs: Any) -> Any:
        return run(fun(*args, **kwargs))

    return run_coroutine


def is_async(fun: Any) -> bool:
    return inspect.iscoroutinefunction(fun)


def _current_claim() -> ClaimedJob | None:
    context = getattr(getattr(current_task, "request", None), "keel_job", None)
    claimed = getattr(context, "_claimed", None)
    return claimed if isinstance(claimed, ClaimedJob) else None


async def _watched(awaitable: Awaitable[Any], claimed: ClaimedJob | None) -> Any:
    job = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_watch(job, claimed)) if claimed is not None else None
    try:
        return await job
    except asyncio.CancelledError:
        if watcher is not None and watcher.done() and watcher.result():
            raise Aborted(ABORTED) from None  # cancelled at its await for the abort
        raise
    finally:
        if watcher is not None:
            watcher.cancel()


async def _watch(job: asyncio.Future[Any], claimed: ClaimedJob) -> bool:
    """Cancel ``job`` once its run is being aborted; whether it did."""
    while not job.done():
        await asyncio.sleep(POLL_S)
        if not job.done() and await asyncio.to_thread(runs.is_aborted, claimed):
            job.cancel()
            return True
    return False


def _settle(here: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on the loop and let it finish, so the next job starts clean."""
    left = [task for task in asyncio.all_tasks(here) if not task.done()]
    for task in left:
        task.cancel()
    if left and not here.is_running():
        here.run_until_complete(asyncio.gather(*left, return_exceptions=True))
