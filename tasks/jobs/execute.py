"""Execute: ``KeelTask``, the Celery base class that claims a job's record and runs it.

Celery delivers the message; the record decides. A delivery runs the
handler only if it can claim the record (waiting, or active with an expired
lock); any other delivery — a duplicate, a stale redelivery, a job that
already finished — is acknowledged and ignored. How the run ended is
recorded by ``tasks.jobs.finish``: failures follow BullMQ's rules and retries
go through the durable delayed set rather than Celery ETA messages.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, NoReturn

from celery import Task, shared_task
from celery.exceptions import Ignore, Reject, Retry
from pydantic import BaseModel

from tasks.config import get_settings
from tasks.db import STORE_UNAVAILABLE, transaction
from tasks.jobs import events, finish, limits, lock_renewal, metrics, registry
from tasks.jobs.enqueue import park_for_republish
from tasks.jobs.errors import Defer
from tasks.jobs.options import JobOptions
from tasks.jobs.store import jobs as store
from tasks.jobs.store.jobs import ClaimedJob

log = logging.getLogger(__name__)

# How long a delivery that found the records unreachable waits before going back to the queue.
STORE_UNAVAILABLE_PAUSE_S = 1.0


class JobContext:
    """What a handler sees of its job: data, counters, and progress reporting."""

    def __init__(self, claimed: ClaimedJob) -> None:
        self._claimed = claimed
        self.id = claimed.id
        self.name = claimed.name
        self.queue = claimed.queue
        self.data = claimed.data
        self.opts: JobOptions = claimed.opts
        self.tenant_id = claimed.tenant_id
        self.user_id = claimed.user_id
        self.attempts_made = claimed.attempts_made
        self.attempts_started = claimed.attempts_started

    def update_progress(self, progress: Any) -> None:
        with transaction() as session:
            store.set_progress(session, self._claimed, progress)
        events.emit(self.queue, "progress", self.id, self.name, data=progress)


class KeelTask(Task):
    """Base class of every Keel job handler (``run(job: JobContext)``)."""

    typing = False
    acks_late = True
    reject_on_worker_lost = True
    #: How the handler takes its job: ``"context"`` — ``run(job: JobContext)``, the job's
    #: data is a dict of named values (``handler``); ``"celery"`` — ``run(*args, **kwargs)``
    #: like any Celery task, the data is stored as ``{"args": [...], "kwargs": {...}}``.
    job_style = "celery"

    def data_for(self, args: Any = (), kwargs: Any = None) -> dict[str, Any]:
        """The job data that Celery-style ``args``/``kwargs`` are recorded as."""
        positional: list[Any] = list(args or ())
        named: dict[str, Any] = dict(kwargs or {})
        if self.job_style == "context":
            if positional:
                raise TypeError(f"{self.name} takes its data as keyword arguments only")
            return named
        return {"args": positional, "kwargs": named}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        admission = self._admit()
        try:
            return self._run_claimed(admission)
        finally:
            limits.release(admission)

    def _admit(self) -> limits.Admission:
        """Wait out the queue's global limits before claiming, so waiting costs no attempt.

        A held job goes back to the durable delayed set (the promoter
        publishes it again) and this delivery is acknowledged: nothing is
        held in worker memory, and a worker dying here loses nothing.
        """
        try:
            return limits.admit(self._delivered_queue())
        except limits.LimitReached as held:
            try:
                park_for_republish([self.request.id], in_s=held.wait_s)
            except STORE_UNAVAILABLE as exc:
                self._requeue_while_store_unavailable(exc)
            raise Ignore() from None

    def _delivered_queue(self) -> str:
        """The queue this delivery came from: a job may be added on any queue."""
        info = self.request.delivery_info or {}
        return str(info.get("routing_key") or self.queue)

    def _run_claimed(self, admission: limits.Admission) -> Any:
        claimed = self._claim()
        limits.started(admission)
        if claimed.stalled:
            events.emit(claimed.queue, "stalled", claimed.id, claimed.name)
        events.emit(
            claimed.queue,
            "active",
            claimed.id,
            claimed.name,
            attemptsStarted=claimed.attempts_started,
        )
        lock_renewal.track(claimed.token)
        metrics.observe(claimed.queue, "wait", claimed.wait_s)
        started = time.monotonic()
        try:
            result = self.run(JobContext(claimed))
        except Defer as deferral:
            finish.deferred(claimed, deferral)
            raise Ignore() from None
        except Exception as exc:
            self._failed(claimed, exc)
            raise
        finally:
            lock_renewal.untrack(claimed.token)
            metrics.observe(claimed.queue, "duration", time.monotonic() - started)
        try:
            finish.completed(claimed, result)
        except finish.NotOurs:
            raise Ignore() from None
        return result

    def _failed(self, claimed: ClaimedJob, exc: Exception) -> None:
        """Record the failure; a retry is Celery's ``Retry`` (state RETRY, no message sent)."""
        try:
            retrying = finish.failed(claimed, exc)
        except finish.NotOurs:
            raise Ignore() from None
        if retrying is not None:
            raise Retry(retrying.reason, exc=exc, when=retrying.at)

    def _claim(self) -> ClaimedJob:
        settings = get_settings()
        worker = self.request.hostname or socket.gethostname()
        try:
            with transaction() as session:
                claimed = store.claim(
                    session,
                    self.request.id,
                    uuid.uuid4().hex,
                    settings.lock_duration_s,
                    worker,
                    self._canvas_context(),
                )
        except STORE_UNAVAILABLE as exc:
            self._requeue_while_store_unavailable(exc)
        if claimed is None:
            raise Ignore()  # not ours to run: duplicate delivery or finished job
        return claimed

    def _requeue_while_store_unavailable(self, exc: Exception) -> NoReturn:
        """The records cannot be reached: put the message back rather than lose it.

        Nothing has run and nothing was recorded, so the delivery is simply
        given back to the broker (at the back of its queue) after a short
        pause, and is tried again until the database answers. Acknowledging
        it — what a plain exception here does — would leave a waiting record
        that no message will ever wake.
        """
        log.warning(
            "job store unavailable; job %s goes back to its queue: %s",
            self.request.id,
            exc.__class__.__name__,
        )
        time.sleep(STORE_UNAVAILABLE_PAUSE_S)
        raise Reject(str(exc), requeue=True) from exc

    def _canvas_context(self) -> dict[str, Any] | None:
        """The chord this delivery belongs to, kept so a later run still counts toward it."""
        request = self.request
        if not request.chord and not request.group:
            return None
        return {"chord": request.chord, "group": request.group, "group_index": request.group_index}


def handler(
    name: str,
    *,
    queue: str,
    schedulable: registry.Schedulable = "system",
    data: type[BaseModel] | None = None,
    submittable: bool = False,
) -> Callable[[Callable[[JobContext], Any]], Task]:
    """Register ``fn(job)`` as the handler of jobs called ``name`` on ``queue``.

    ``schedulable`` says who may put it in a job scheduler (``"tenant"`` or only
    the ``"system"``); ``data`` is the model of the data a tenant may give it;
    ``submittable`` lets a tenant's user add it over HTTP (``POST /api/v1/jobs``).
    """

    limits.configured()  # a malformed KEEL_QUEUE_LIMITS stops the worker at start, loudly
    registry.declare(registry.JobType(name, queue, schedulable, data, submittable))

    def register(fn: Callable[[JobContext], Any]) -> Task:
        return shared_task(name=name, base=KeelTask, queue=queue, job_style="context")(fn)

    return register
