"""The run: a claimed job starts, its handler is called, its lock is renewed meanwhile.

``start`` counts the job as started by its queue's limits, says so (``active``, and
``stalled`` for a run taken over from a lost worker) and keeps its lock renewed, up to
its time limit where the pool cannot enforce one (``tasks.jobs.run.timeouts``).
``Run.call`` calls the handler its way — ``run(job)``, or ``run(*args, **kwargs)`` like
Celery — with the request the record describes, for the job's owner. What the run ended
as is recorded by ``tasks.jobs.run.outcome``.
"""

from __future__ import annotations

import inspect
import time
from datetime import UTC, datetime
from typing import Any

from tasks.jobs.calls.celery_task import CeleryTask, RetriesExhausted, RetryRequested
from tasks.jobs.intake.messages import KEY_HEADER, TENANT_HEADER
from tasks.jobs.model.formats import KEEL_HEADER
from tasks.jobs.model.owner import Owner, running_for
from tasks.jobs.observe import events, metrics
from tasks.jobs.run import aio, limits, lock_renewal, timeouts
from tasks.jobs.run.context import JobContext
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform import tracing

# Headers only Keel sets on a message; a record's stored call headers never stand in for them.
_KEEL_HEADERS = frozenset({KEEL_HEADER, TENANT_HEADER, KEY_HEADER})


class JobExpired(Exception):
    """The job had not started by its ``expiresAt`` (Celery's ``expires``)."""


class Run:
    """A claimed job's run, from its start to its handler's return (``took``) or raise."""

    def __init__(
        self,
        task: CeleryTask,
        claimed: ClaimedJob,
        limit: float | None,
        soft_limit: float | None = None,
    ) -> None:
        self.task = task
        self.claimed = claimed
        self.limit = limit  # its hard time limit, where nothing else enforces it
        self.soft_limit = soft_limit  # its soft one, where nothing else raises it
        self.started = time.monotonic()
        self.took: float | None = None  # how long a run that returned took (its end says)

    @property
    def until(self) -> float | None:
        """When its time limit passes (``time.monotonic()``), if it has one to keep."""
        return self.started + self.limit if self.limit is not None else None

    def call(self) -> Any:
        """The handler's result: it returned in time, and asked for no retry. Else raises."""
        claimed = self.claimed
        soft_until = self.started + self.soft_limit if self.soft_limit is not None else None
        with tracing.span("keel.handler", {"keel.job.name": claimed.name}):
            try:  # (an ``async def`` handler's coroutine is stopped at these: ``aio``)
                with aio.time_limits(self.until, soft_until):
                    result = call_handler(self.task, claimed)
            except aio.HardLimitReached:  # stopped at its hard limit: ends as prefork's kill
                raise timeouts.timed_out(self.limit or 0) from None
        asked: RetryRequested | None = getattr(self.task.request, "keel_retry", None)
        if asked is not None:  # ``self.retry(throw=False)``: the run ends as that retry
            raise asked
        took = time.monotonic() - self.started
        if self.limit is not None and took > self.limit:
            raise timeouts.returned_late(self.limit, took)
        self.took = took
        return result

    def stop(self) -> None:
        """Its lock is no longer renewed; a run that did not return counts its time here."""
        lock_renewal.untrack(self.claimed.token)
        if self.took is None:
            duration = time.monotonic() - self.started
            metrics.observe(self.claimed.queue, "duration", duration, self.claimed.name)


def start(task: CeleryTask, admission: limits.Admission, claimed: ClaimedJob) -> Run:
    """The claimed job starts: counted by its limits, announced, its lock kept renewed."""
    limits.started(admission)
    if claimed.stalled:
        events.emit_job(claimed, "stalled")
    active = events.Event.of(
        claimed,
        "active",
        observed=("wait", claimed.wait_s),
        attemptsStarted=claimed.attempts_started,
    )
    events.later(active)  # with its end's event if the run is short: one round trip
    limit = timeouts.unenforced_limit(task, task.request)  # (prefork: None, it kills)
    run = Run(task, claimed, limit, timeouts.unenforced_soft_limit(task, task.request))
    lock_renewal.track(claimed.token, run.until)
    limits.hold_until(admission, run.until)
    return run


def call_handler(task: CeleryTask, claimed: ClaimedJob) -> Any:
    """Call the handler its way: ``run(job)``, or ``run(*args, **kwargs)`` like Celery."""
    expires = claimed.opts.expires_at
    if expires is not None and expires <= datetime.now(UTC):
        raise RetriesExhausted(JobExpired(f"expired at {expires.isoformat()}"))
    _request_from_record(task.request, claimed)
    context = JobContext(claimed)
    task.request.keel_job = context
    # What the handler sends the Celery way (``.delay()``, canvas) belongs to the job's
    # tenant and user, as its chain steps and links do (``owner.running_for``).
    owner = None
    if claimed.tenant_id is not None:
        owner = Owner(claimed.tenant_id, claimed.user_id or "")
    with running_for(owner):
        if task.job_style == "context":
            returned = task.run(context)
        else:
            args = list(claimed.data.get("args", ()))
            kwargs = dict(claimed.data.get("kwargs", {}))
            # As Celery's request shows them (the wake-up message carries the record's data)
            task.request.args, task.request.kwargs = args, kwargs
            returned = task.run(*args, **kwargs)
        # A task class's own ``async def run`` (a function's is run by ``aio.async_run``)
        return aio.run(returned, claimed) if inspect.isawaitable(returned) else returned


def _request_from_record(request: Any, claimed: ClaimedJob) -> None:
    """The request as the record says: its attempts, and the call's ``headers=`` from the
    record whichever message brought it (Keel's own headers from the message only)."""
    request.retries = claimed.attempts_made
    request.keel_retry = None
    headers = (claimed.celery_ctx or {}).get("headers") or {}
    if headers:
        request.headers = dict(headers)
        for header, value in headers.items():
            if header in _KEEL_HEADERS:  # Keel's, from the message only
                continue
            if getattr(request, header, None) is None:
                setattr(request, header, value)
