"""``async def`` tasks and handlers: each runs to its end on an event loop of its thread.

A worker's pool slot runs one job at a time, async or not: the coroutine runs on the
event loop of the thread that runs the job (a prefork pool process's, or each thread's of
a ``-P threads`` pool), made once per thread and kept. So, with ``-P threads -c 100``, a
hundred async jobs await at once in one process; with prefork, one per process, as a
sync job would. Everything Keel does for a sync job holds: retries (``autoretry_for``,
``self.retry``, the job's backoff), ``Defer``, job logs and progress (short synchronous
calls). An abort cancels the coroutine at the await it is in (``asyncio.CancelledError``
there; the job ends ``cancelled``): a watcher beside it asks the record every ``POLL_S``.

Time limits: under prefork, Celery's own (its soft limit's signal stops the process's
loop, its hard limit kills the process). The threads and solo pools keep none, so there
the run gives its limits (``time_limits``, from ``tasks.jobs.run.running``) and they are
kept here: at the soft limit the coroutine is cancelled at its await and the run raises
``SoftTimeLimitExceeded``, as under prefork; at the hard limit it is cancelled and the
run raises ``HardLimitReached``, which the run records as prefork's kill is recorded,
"timed out after N s".

``async_run(fun)`` is what Keel's app makes of an ``async def`` task function
(``tasks.assembly``): a function that runs it, so Celery's ``autoretry_for`` sees its
errors as a sync function's.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery import current_task
from celery.exceptions import SoftTimeLimitExceeded

from tasks.jobs.end.abort import ABORTED, Aborted
from tasks.jobs.store import runs
from tasks.jobs.store.runs import ClaimedJob

POLL_S = 0.5  # how often a running coroutine's record is asked whether it is being aborted

_thread = threading.local()


class HardLimitReached(BaseException):
    """A run's coroutine was stopped at its hard time limit. Not an ``Exception``: Celery's
    ``autoretry_for``, which wraps the task function, must not retry it as the task's own
    error (prefork's kill is not one either); the run records it as timed out."""


@dataclass(frozen=True)
class Deadlines:
    """When this thread's run stops its coroutine (``time.monotonic()``), where the pool
    does not: soft (``SoftTimeLimitExceeded``) and hard (``HardLimitReached``)."""

    hard: float | None = None
    soft: float | None = None

    def stops(self) -> list[tuple[float, BaseException]]:
        soft = [(self.soft, SoftTimeLimitExceeded())] if self.soft is not None else []
        hard = [(self.hard, HardLimitReached())] if self.hard is not None else []
        return [*soft, *hard]


@contextmanager
def time_limits(hard: float | None, soft: float | None) -> Iterator[None]:
    """The coroutines this thread runs meanwhile (its run's) stop at these deadlines."""
    before = getattr(_thread, "deadlines", None)
    _thread.deadlines = Deadlines(hard, soft)
    try:
        yield
    finally:
        _thread.deadlines = before


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
    deadlines = getattr(_thread, "deadlines", None) or Deadlines()
    here = loop()
    try:
        return here.run_until_complete(_watched(awaitable, claimed, deadlines))
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


async def _watched(
    awaitable: Awaitable[Any], claimed: ClaimedJob | None, deadlines: Deadlines
) -> Any:
    job = asyncio.ensure_future(awaitable)
    stopped: list[BaseException] = []  # why Keel cancelled ``job``, latest last

    def stop(why: BaseException) -> None:
        if not job.done():  # (again after a soft limit, if it goes on past its cancel)
            stopped.append(why)
            job.cancel()

    here = asyncio.get_running_loop()
    timers = [
        here.call_later(max(0.0, at - time.monotonic()), stop, why) for at, why in deadlines.stops()
    ]
    watcher = asyncio.ensure_future(_watch(job, claimed, stop)) if claimed is not None else None
    try:
        return await job
    except asyncio.CancelledError:
        if stopped:  # cancelled at its await for an abort or a time limit
            raise stopped[-1] from None
        raise
    finally:
        for timer in timers:
            timer.cancel()
        if watcher is not None:
            watcher.cancel()


async def _watch(
    job: asyncio.Future[Any], claimed: ClaimedJob, stop: Callable[[BaseException], None]
) -> None:
    """Stop ``job`` once its run is being aborted."""
    while not job.done():
        await asyncio.sleep(POLL_S)
        if not job.done() and await asyncio.to_thread(runs.is_aborted, claimed):
            stop(Aborted(ABORTED))
            return


def _settle(here: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on the loop and let it finish, so the next job starts clean."""
    left = [task for task in asyncio.all_tasks(here) if not task.done()]
    for task in left:
        task.cancel()
    if left and not here.is_running():
        here.run_until_complete(asyncio.gather(*left, return_exceptions=True))
