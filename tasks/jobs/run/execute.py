"""Execute: ``KeelTask``, the Celery base class that claims a job's record and runs it.

Celery delivers the message; the record decides. A delivery runs the
handler only if it can claim the record (waiting, or active with an expired
lock); any other delivery — a duplicate, a stale redelivery, a job that
already finished — is acknowledged and ignored. How the run ended is
recorded by ``tasks.jobs.end.finish``: failures follow BullMQ's rules and retries
go through the durable delayed set rather than Celery ETA messages.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from celery import Task, shared_task
from celery.exceptions import Ignore, Reject, Retry
from pydantic import BaseModel

from tasks.jobs.calls.celery_task import CeleryTask, RetriesExhausted, RetryRequested
from tasks.jobs.end import abort, cancel, ending, finish
from tasks.jobs.intake import enqueue, pauses, tenancy
from tasks.jobs.intake.celery_options import with_options
from tasks.jobs.intake.enqueue import AddedJob
from tasks.jobs.intake.messages import KEY_HEADER, TENANT_HEADER
from tasks.jobs.model import formats, registry
from tasks.jobs.model.errors import Defer, RateLimited
from tasks.jobs.model.formats import KEEL_HEADER
from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
from tasks.jobs.model.models import State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner, current_owner, running_for
from tasks.jobs.observe import events, metrics
from tasks.jobs.observe import quiet as quiet_jobs
from tasks.jobs.run import job_log, key_limits, limits, lock_renewal, tenant_caps, timeouts
from tasks.jobs.store import jobs as store
from tasks.jobs.store import parents, runs, upkeep
from tasks.jobs.store import pauses as pauses_store
from tasks.jobs.store.jobs import NewJob
from tasks.jobs.store.pauses import Hold
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform import tracing
from tasks.platform.config import get_settings
from tasks.platform.db import STORE_UNAVAILABLE, transaction

log = logging.getLogger(__name__)

# How long a delivery that found the records unreachable waits before going back to the queue.
STORE_UNAVAILABLE_PAUSE_S = 1.0
PAUSED = "its queue is paused: held until the pause is lifted"
PAUSED_STALLED = "its queue is paused and its last run's worker is gone: requeued, then held"


class JobExpired(Exception):
    """The job had not started by its ``expiresAt`` (Celery's ``expires``)."""


class UnrecordedEnd(Exception):
    """A run ended but its result, or what its end triggers, could not be recorded."""


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
            runs.set_progress(session, self._claimed, progress)
        events.emit(self.queue, "progress", self.id, self.name, data=progress)

    def log(self, message: object) -> int | None:
        """Add a line to the job's log (BullMQ's ``job.log()``), read by ``GET
        /api/v1/jobs/<id>/logs`` and the job's page; its number among the job's lines."""
        return job_log.write(self.id, self.attempts_started, message)

    def is_aborted(self) -> bool:
        """Whether this job is being aborted, or its run no longer counts: stop and return
        (what it returns is not recorded; the job ends ``cancelled``). One query a call."""
        return runs.is_aborted(self._claimed)

    def add_child(
        self,
        name: str,
        data: dict[str, Any],
        *,
        queue: str | None = None,
        opts: JobOptions | None = None,
    ) -> AddedJob:
        """Add a job as this job's child, for the same owner (BullMQ's flow child): a
        ``Defer(..., waiting_children=True)`` then waits for this job's children, and the
        end of the last of them runs this job again at once. ``queue``: the job type's."""
        owner = Owner(self.tenant_id, self.user_id or "") if self.tenant_id else None
        job_type = registry.get(name)
        if queue is None and job_type is None:
            raise ValueError(f"no job type is called {name!r}: give its queue")
        where = queue or job_type.queue  # type: ignore[union-attr]
        return enqueue.add(name, data, queue=where, opts=opts, owner=owner, parent=self.id)

    def children(self) -> list[dict[str, Any]]:
        """This job's children, oldest first: ``id``, ``name``, ``state``, ``result``,
        ``failedReason`` (BullMQ's ``getChildrenValues``, with the failures)."""
        with transaction() as session:
            return parents.children(session, self.id)


class InProcessJob:
    """A ``JobContext`` for a handler run in the caller's process (``task.apply()``,
    ``task_always_eager``): the same fields, nothing recorded; progress is kept here."""

    def __init__(self, task: CeleryTask, data: dict[str, Any]) -> None:
        request = task.request
        owner = current_owner()
        self.id = str(request.id or uuid.uuid4().hex)
        self.name = task.name
        self.queue = task.job_queue()
        self.data = data
        self.opts: JobOptions = task.default_options(data, owner)
        self.tenant_id = owner.tenant_id if owner is not None else None
        self.user_id = owner.user_id if owner is not None else None
        self.attempts_made = int(request.retries or 0)
        self.attempts_started = self.attempts_made + 1
        self.progress: Any = None
        self.logs: list[str] = []

    def update_progress(self, progress: Any) -> None:
        self.progress = progress

    def is_aborted(self) -> bool:
        """Nothing aborts a run in the caller's process."""
        return False

    def add_child(self, name: str, data: dict[str, Any], **_options: Any) -> NoReturn:
        raise RuntimeError(
            "job.add_child needs a worker: a step job does not run in the caller's process"
            " (task.apply(), task_always_eager)"
        )

    def children(self) -> list[dict[str, Any]]:
        """None in the caller's process: children are added by a worker's run only."""
        return []

    def log(self, message: object) -> int:
        """The line goes to this process's log and ``self.logs``; nothing is stored."""
        self.logs.append(job_log.echo(message))
        return len(self.logs)


class KeelTask(CeleryTask):
    """Base class of every Keel job: claims its record, runs the handler, records the end.

    How Celery sends, retries and declares it is ``CeleryTask``'s
    (``tasks.jobs.calls.celery_task``).
    """

    typing = False
    acks_late = True
    reject_on_worker_lost = True
    Request = "tasks.jobs.run.request:KeelRequest"  # a hard time limit ends the run's record

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.is_eager:  # ``apply()``, ``task_always_eager``: Celery's tracer ran us
            return self._run_in_process(args, kwargs)
        if self.request.called_directly:  # ``task(...)`` as a function: pushes its request
            return Task.__call__(self, *args, **kwargs)
        self._hold_if_paused()
        admission = self._admit(args, kwargs)
        try:
            return self._run_claimed(admission, args, kwargs)
        except abort.Aborted:  # its end was recorded as the job's: cancelled
            self._announce_aborted()
            raise Ignore() from None
        finally:
            limits.release(admission)

    def _run_in_process(self, args: Any, kwargs: Any) -> Any:
        """The handler, run the way Celery's eager mode runs a task: no record, no servers
        (``tasks.jobs.calls.celery_task.in_process``)."""
        if self.job_style == "context":
            job = InProcessJob(self, self.data_for(args, kwargs))
            self.request.keel_job = job  # what ``self.log()`` writes to
            return self.run(job)
        self.request.keel_job = InProcessJob(self, {"args": list(args), "kwargs": dict(kwargs)})
        return self.run(*args, **kwargs)

    def log(self, message: object) -> int | None:
        """``self.log(message)`` in a bound task (``bind=True``): a line of the running job's
        log, as ``job.log()`` writes it for a ``handler(job)``."""
        job: JobContext | InProcessJob | None = getattr(self.request, "keel_job", None)
        if job is None:  # the task called as a function: no job of its own to keep it
            job_log.echo(message)
            return None
        return job.log(message)

    def is_aborted(self) -> bool:
        """Whether the running job is being aborted (``DELETE /api/v1/jobs/<id>``, ``keel
        jobs cancel``), or its run no longer counts (it was cancelled or taken over): the
        handler should stop, as its result would not be recorded. Celery's
        ``AbortableTask.is_aborted()``, read from the record (one query a call). ``False``
        outside a worker's run (``apply()``, eager mode, a direct call)."""
        job: JobContext | InProcessJob | None = getattr(self.request, "keel_job", None)
        return job.is_aborted() if job is not None else False

    def _announce_aborted(self) -> None:
        """A ``task-revoked`` event: Flower shows the aborted run's task as REVOKED."""
        if not self.send_events:
            return
        try:
            self.send_event("task-revoked", terminated=False, signum=None, expired=False)
        except Exception as exc:  # events are for watching; a lost one changes nothing
            log.debug("could not announce aborted run %s: %s", self.request.id, exc)

    def _hold_if_paused(self) -> None:
        """A recorded job of a paused queue is held (``tasks.jobs.intake.pauses``) before its
        queue's limits are asked: a limit would park it to delayed, and the promoter would
        publish it again and again while the pause lasts. A message without a record is
        recorded first, then held (``_claim``)."""
        if not getattr(self.request, KEEL_HEADER, None):
            return
        try:
            if not pauses.queue_paused(self._delivered_queue()):
                return
            found = pauses.hold_delivery(self.request.id)
        except STORE_UNAVAILABLE as exc:
            self._requeue_while_store_unavailable(exc)
        self._ignore_if_held(found)

    def _ignore_if_held(self, found: Hold) -> None:
        if found is Hold.HELD:
            self._announce_ignored(PAUSED)
            raise Ignore()
        if found is Hold.LEAVE:
            self._announce_ignored(PAUSED_STALLED)
            raise Ignore()

    def _admit(self, args: Any, kwargs: Any) -> limits.Admission:
        """Wait out the queue's global limits, its tenant's cap on running jobs and the job's
        key limits before claiming, so waiting costs no attempt.

        A held job goes back to the durable delayed set (the promoter, or its key's
        line, publishes it again) and this delivery is acknowledged: nothing is
        held in worker memory, and a worker dying here loses nothing. A
        delivery without a record is recorded first, or acknowledging it
        would lose it. A job its key's strategy supersedes is cancelled.
        """
        try:
            admission = limits.admit(self._delivered_queue())
            try:
                data, given = self._key_data(kwargs), self._key_given()
                tenant_caps.admit(admission, given.tenant, self.request.id)
                key_limits.admit(admission, self, data, self.request.id, given)
            except BaseException:
                limits.release(admission)
                raise
            return admission
        except limits.LimitReached as held:
            self._park_held(held, args, kwargs)
        except key_limits.Superseded as superseded:
            self._cancel_superseded(str(superseded), args, kwargs)
        except STORE_UNAVAILABLE as exc:  # a key limit reads the record
            self._requeue_while_store_unavailable(exc)

    def _key_data(self, kwargs: Any) -> dict[str, Any]:
        """What the job's keys are read from: its data; a Celery-style task's keyword
        arguments (a recorded job's message carries its data: ``{"args", "kwargs"}``)."""
        named = dict(kwargs or {})
        if self.job_style == "context" or not getattr(self.request, KEEL_HEADER, None):
            return named
        inner = named.get("kwargs")
        return dict(inner) if isinstance(inner, dict) else {}

    def _key_given(self) -> key_limits.Given:
        """The job's tenant and its call's concurrency key, as its message carries them: only a
        Keel message's (one sent without Keel is a system job's, whatever its headers say)."""
        if not getattr(self.request, KEEL_HEADER, None):
            return key_limits.Given()
        tenant, key = (getattr(self.request, h, None) for h in (TENANT_HEADER, KEY_HEADER))
        return key_limits.Given(
            tenant=tenant if isinstance(tenant, str) else None,
            concurrency_key=key if isinstance(key, str) and key else None,
        )

    def _park_held(self, held: limits.LimitReached, args: Any, kwargs: Any) -> NoReturn:
        try:
            with transaction() as session:
                recorded = bool(getattr(self.request, KEEL_HEADER, None))
                if not recorded:
                    self._record_on_arrival(session, args, kwargs)
                parked = upkeep.park(session, [self.request.id], held.wait_s)
            if not parked and recorded and runs.await_insert(self.request.id):
                with transaction() as session:  # its record committed since (see _claim)
                    upkeep.park(session, [self.request.id], held.wait_s)
        except STORE_UNAVAILABLE as exc:
            self._requeue_while_store_unavailable(exc)
        if held.after_park is not None:
            try:
                held.after_park()
            except Exception:  # the parked job asks again when due: a wait, not a loss
                log.warning("could not wake the next job of a key", exc_info=True)
        self._announce_ignored(f"held by its {held.reason} limit; it runs again later")
        raise Ignore() from None

    def _cancel_superseded(self, reason: str, args: Any, kwargs: Any) -> NoReturn:
        """A job of its key runs (``cancel_newest``): this one is cancelled, not run."""
        try:
            with transaction() as session:
                recorded = bool(getattr(self.request, KEEL_HEADER, None))
                if not recorded:
                    self._record_on_arrival(session, args, kwargs)
                done = cancel.cancel_in(
                    session, [self.request.id], [State.WAITING], actor="key", reason=reason
                )
            if not done and recorded and runs.await_insert(self.request.id):
                with transaction() as session:  # its record committed since (see _claim)
                    done = cancel.cancel_in(
                        session, [self.request.id], [State.WAITING], actor="key", reason=reason
                    )
        except STORE_UNAVAILABLE as exc:
            self._requeue_while_store_unavailable(exc)
        cancel.announce(done, by="key")
        self._announce_ignored(reason)
        raise Ignore() from None

    def _hold_limiter(self, limited: RateLimited, kwargs: Any) -> None:
        """The handler said its service limits it: no job of its key (or queue) starts
        until then, on any worker."""
        try:
            held = key_limits.rate_limited(
                self, self._key_data(kwargs), self._delivered_queue(), limited, self._key_given()
            )
        except Exception:  # the job still waits; the others may try the service meanwhile
            log.warning("could not hold the rate limit of %s", self.name, exc_info=True)
            return
        if not held:
            log.info(
                "%s: rate limited for %d ms, but it has no %s rate limit to hold: only the"
                " job waits",
                self.name,
                limited.delay_ms,
                limited.scope,
            )

    def _delivered_queue(self) -> str:
        """The queue this delivery came from: a job may be added on any queue."""
        info = self.request.delivery_info or {}
        return str(info.get("routing_key") or self.queue)

    def _run_claimed(self, admission: limits.Admission, args: Any, kwargs: Any) -> Any:
        with tracing.span("keel.claim", {"keel.job.id": self.request.id}) as span:
            claimed = self._claim(args, kwargs)
            span.set_attribute("keel.job.attempt", claimed.attempts_started)
            span.set_attribute("keel.job.stalled", claimed.stalled)
        limits.started(admission)
        if claimed.stalled:
            events.emit(claimed.queue, "stalled", claimed.id, claimed.name)
        active = events.Event(
            claimed.queue,
            "active",
            claimed.id,
            claimed.name,
            observed=("wait", claimed.wait_s),
            attemptsStarted=claimed.attempts_started,
        )
        events.later(active)  # with its end's event if the run is short: one round trip
        limit = timeouts.unenforced_limit(self, self.request)  # (prefork: None, it kills)
        started = time.monotonic()
        lock_renewal.track(claimed.token, started + limit if limit is not None else None)
        limits.hold_until(admission, started + limit if limit is not None else None)
        ran: float | None = None  # how long a run that returned took (its end reports it)
        try:
            with tracing.span("keel.handler", {"keel.job.name": claimed.name}):
                result = self._run_handler(claimed)
            asked: RetryRequested | None = getattr(self.request, "keel_retry", None)
            if asked is not None:  # ``self.retry(throw=False)``: the run ends as that retry
                raise asked
            took = time.monotonic() - started
            if limit is not None and took > limit:
                raise timeouts.returned_late(limit, took)
            ran = took
        except Defer as deferral:
            if isinstance(deferral, RateLimited):
                self._hold_limiter(deferral, kwargs)
            finish.deferred(claimed, deferral)
            self._announce_ignored(f"deferred: {deferral}")
            raise Ignore() from None
        except RetryRequested as requested:
            self._failed(
                claimed, requested.exc or requested, requested.delay_ms, data=requested.data
            )
            raise
        except RetriesExhausted as exhausted:
            self._failed(claimed, exhausted.original, retry_in_ms=None)
            raise exhausted.original from None
        except Reject as rejected:
            # Requeued: run again at once, as Celery would, but a requeue is a retry here,
            # bounded like one (``max_retries``): a message that always rejects ends failed.
            if rejected.requeue and claimed.attempts_made < self.retry_limit():
                self._failed(claimed, rejected, retry_in_ms=0)
                raise
            self._failed(claimed, rejected, retry_in_ms=None)
            raise Reject(rejected.reason, requeue=False) from None  # not back to the broker
        except Exception as exc:
            self._failed(claimed, exc)
            raise
        finally:
            lock_renewal.untrack(claimed.token)
            if ran is None:
                metrics.observe(claimed.queue, "duration", time.monotonic() - started, claimed.name)
        try:
            with tracing.span("keel.finish", {"keel.job.end": "completed"}):
                finish.completed(claimed, result, ran)
        except finish.NotOurs:
            self._announce_ignored("taken over by another worker; this result is not recorded")
            raise Ignore() from None
        except STORE_UNAVAILABLE:
            raise  # the record stays active: its lock runs out and the run is tried again
        except abort.Aborted:
            raise  # recorded: the job was being aborted, and ended cancelled
        except Exception as exc:
            # The run happened but its end cannot be recorded (a result JSON cannot hold, a
            # chain step its task cannot take): left active, the job would stall and run
            # again, and again fail to record. It fails for good, saying why.
            self._failed(claimed, UnrecordedEnd(f"its end could not be recorded: {exc}"), None)
            raise
        # Its chain's next step and its links were recorded with its end (tasks.jobs.end.canvas):
        # Celery's tracer must not send them a second time.
        self.request.chain = None
        self.request.callbacks = None
        return result

    def _run_handler(self, claimed: ClaimedJob) -> Any:
        """Call the handler its way: ``run(job)``, or ``run(*args, **kwargs)`` like Celery."""
        expires = claimed.opts.expires_at
        if expires is not None and expires <= datetime.now(UTC):
            raise RetriesExhausted(JobExpired(f"expired at {expires.isoformat()}"))
        self.request.retries = claimed.attempts_made
        self.request.keel_retry = None
        headers = (claimed.celery_ctx or {}).get("headers") or {}
        if headers:  # the call's ``headers=``, from the record whichever message brought it
            self.request.headers = dict(headers)
            for header, value in headers.items():
                if header in _KEEL_HEADERS:  # Keel's, from the message only
                    continue
                if getattr(self.request, header, None) is None:
                    setattr(self.request, header, value)
        context = JobContext(claimed)
        self.request.keel_job = context
        # What the handler sends the Celery way (``.delay()``, canvas) belongs to the job's
        # tenant and user, as its chain steps and links do (``owner.running_for``).
        owner = None
        if claimed.tenant_id is not None:
            owner = Owner(claimed.tenant_id, claimed.user_id or "")
        with running_for(owner):
            if self.job_style == "context":
                return self.run(context)
            args = list(claimed.data.get("args", ()))
            kwargs = dict(claimed.data.get("kwargs", {}))
            # As Celery's request shows them (the wake-up message carries the record's data)
            self.request.args, self.request.kwargs = args, kwargs
            return self.run(*args, **kwargs)

    _NO_RULES: Any = object()

    def _failed(
        self,
        claimed: ClaimedJob,
        exc: BaseException,
        retry_in_ms: Any = _NO_RULES,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Record the failure; a retry is Celery's ``Retry`` (state RETRY, no message sent).

        By the job's options, or — ``retry_in_ms`` given — as ``self.retry`` decided.
        """
        by_rules = retry_in_ms is self._NO_RULES
        try:
            with tracing.span("keel.finish", {"keel.job.end": "failed"}) as span:
                retrying = finish.failed(
                    claimed,
                    exc,
                    by_rules=by_rules,
                    retry_in_ms=None if by_rules else retry_in_ms,
                    data=data,
                )
                span.set_attribute("keel.job.retrying", retrying is not None)
        except finish.NotOurs:
            self._announce_ignored("taken over by another worker; this failure is not recorded")
            raise Ignore() from None
        if retrying is not None:
            raise Retry(retrying.reason, exc=exc, when=retrying.at)

    def _claim(self, args: Any, kwargs: Any) -> ClaimedJob:
        settings = get_settings()
        worker = self.request.hostname or socket.gethostname()
        header = getattr(self.request, KEEL_HEADER, None)
        if not formats.reads_message(header):
            # A release newer than this worker's wrote it (tasks.jobs.model.formats): misread, it
            # could run the wrong thing. Its record stays waiting for a worker that reads it.
            log.error(
                "job %s: message format %r is not one this worker reads (%s); left waiting",
                self.request.id,
                header,
                sorted(formats.MESSAGE_FORMATS_READ),
            )
            self._announce_ignored(f"message format {header} is newer than this worker reads")
            raise Ignore()
        recorded = bool(header)
        claim = (self.request.id, uuid.uuid4().hex, settings.lock_duration_s, worker)
        try:
            # A paused queue's job is held, not claimed (``tasks.jobs.intake.pauses``); a
            # recorded one was looked at already (``_hold_if_paused``).
            paused = pauses.queue_paused(self._delivered_queue())
            if recorded:  # a Keel message's record exists: its claim is one statement
                claimed = runs.claim_alone(*claim, self._canvas_context())
                if claimed is None and runs.await_insert(self.request.id):
                    # The record may have been committed since the claim looked: a canvas
                    # child is published inside the transaction that records it.
                    if paused:
                        self._ignore_if_held(pauses.hold(self.request.id))
                    claimed = runs.claim_alone(*claim, self._canvas_context())
            else:
                with transaction() as session:
                    self._record_on_arrival(session, args, kwargs)
                    found = pauses_store.hold(session, self.request.id) if paused else Hold.RUN
                    claimed = None
                    if found is Hold.RUN:
                        claimed = runs.claim(session, *claim, self._canvas_context())
                self._ignore_if_held(found)
        except STORE_UNAVAILABLE as exc:
            self._requeue_while_store_unavailable(exc)
        if claimed is None:
            # Not ours to run: a duplicate delivery, or a job that finished. Say so to
            # Flower, which would otherwise show this delivery as started forever.
            self._announce_ignored("the job's record is not waiting")
            raise Ignore()
        return claimed

    def _record_on_arrival(self, session: Any, args: Any, kwargs: Any) -> None:
        """A message sent without Keel (``send_task`` by name, another app): record it now.

        Its record is added as waiting in the claim's transaction (nothing if a
        job with its id exists), so the claim runs it like any other job. Arguments
        the handler cannot take (positional ones for a ``handler(job)`` task) are
        recorded as given, and the job fails at once saying why: run, it would
        read them as its data.
        """
        refused = None
        try:
            data = self.data_for(args, kwargs)
        except TypeError as exc:
            data, refused = {"args": list(args), "kwargs": dict(kwargs)}, str(exc)
        opts = self.default_options(data, None)
        job = NewJob(
            id=str(self.request.id),
            name=self.name,
            queue=self._delivered_queue(),
            data=data,
            tenant_id=None,
            user_id=None,
            opts=opts,
            celery_ctx=tracing.carried(with_options(self._canvas_context(), opts)),
            priority=tenancy.rank(_message_priority(self.request)),
        )
        if not store.insert(session, job):
            return
        log.info("job %s (%s) arrived without a record; recorded on arrival", job.id, job.name)
        if refused is None:
            return
        failed = runs.fail_unsupported(session, job.id, job.name, refused)
        if failed is not None:
            ending.ended(session, failed, State.FAILED, refused)

    def _announce_ignored(self, reason: str) -> None:
        """A ``task-ignored`` event: Flower shows the delivery as IGNORED, not STARTED."""
        if not self.send_events:
            return  # a task kept out of Flower (``handler(events=False)``) had no STARTED either
        try:
            self.send_event("task-ignored", reason=reason)
        except Exception as exc:  # events are for watching; a lost one changes nothing
            log.debug("could not announce ignored delivery %s: %s", self.request.id, exc)

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
        """The canvas this delivery belongs to (chord, chain, links), kept on the record so a
        later run — retried, promoted, redelivered — still counts toward its chord and
        still triggers its children."""
        request = self.request
        ctx = {
            "chord": request.chord,
            "group": request.group,
            "group_index": request.group_index,
            "chain": request.chain,
            "link": request.callbacks,
            "link_error": request.errbacks,
            "parent_id": request.parent_id,
            "root_id": request.root_id,
        }
        limits = list(request.timelimit or ())  # the sender's time_limit / soft_time_limit
        if any(limit is not None for limit in limits):
            ctx["timelimit"] = limits
        kept = {key: value for key, value in ctx.items() if value not in (None, [], ())}
        return kept or None


# Headers only Keel sets on a message; a record's stored call headers never stand in for them.
_KEEL_HEADERS = frozenset({KEEL_HEADER, TENANT_HEADER, KEY_HEADER})


def _message_priority(request: Any) -> Any:
    """The priority a message arrived with (its sender's ``priority=``; ``None``: none)."""
    return (getattr(request, "delivery_info", None) or {}).get("priority")


def handler(
    name: str,
    *,
    queue: str,
    schedulable: registry.Schedulable = "system",
    data: type[BaseModel] | None = None,
    submittable: bool = False,
    options: Callable[[dict[str, Any], Owner | None], JobOptions] | None = None,
    events: bool = True,
    control: bool = False,
    quiet: bool = False,
    timeout: float | None = None,
    key_concurrency: KeyConcurrency | None = None,
    key_rate: KeyRate | None = None,
) -> Callable[[Callable[[JobContext], Any]], Task]:
    """Register ``fn(job)`` as the handler of jobs called ``name`` on ``queue``.

    ``schedulable`` says who may put it in a job scheduler (``"tenant"`` or only
    the ``"system"``); ``data`` is the model of the data a tenant may give it;
    ``submittable`` lets a tenant's user add it over HTTP (``POST /api/v1/jobs``);
    ``options(data, owner)`` gives the options of a job sent the Celery way
    (``.delay()``, ``.apply_async()``, canvas) unless the call gives its own.
    ``events=False``: no Celery task events (``send_events``), so a periodic system job
    does not fill Flower's task list; its records and Keel's own events stay.
    ``quiet=True``: its routine log lines (received, succeeded, fired) are DEBUG, not INFO,
    and ``keel jobs list`` leaves it out unless asked (``tasks.jobs.observe.quiet``).
    ``control=True``: a control job, published at the front of its queue (the top broker
    priority) whatever its party's load, so it never waits behind the bulk jobs it unblocks.
    ``timeout``: seconds a run may take (Celery's ``time_limit``, which a call's
    ``time_limit=`` replaces): past it the run is ended and recorded as failed, "timed out
    after N s", and the job runs again by its attempts and backoff
    (``tasks.jobs.run.timeouts``).
    ``key_concurrency`` / ``key_rate``: limits by a key read from each job's data, across
    every worker (``tasks.jobs.model.key_limits``): at most N of one key's jobs running at
    once, with a strategy, and at most N starts of one key's jobs per window.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if key_concurrency is not None and not isinstance(key_concurrency, KeyConcurrency):
        raise TypeError(f"key_concurrency is a KeyConcurrency, not {key_concurrency!r}")
    if key_rate is not None and not isinstance(key_rate, KeyRate):
        raise TypeError(f"key_rate is a KeyRate, not {key_rate!r}")

    limits.configured()  # a malformed KEEL_QUEUE_LIMITS stops the worker at start, loudly
    registry.declare(registry.JobType(name, queue, schedulable, data, submittable, control))
    if quiet:
        quiet_jobs.declare(name)

    def register(fn: Callable[[JobContext], Any]) -> Task:
        attributes: dict[str, Any] = {
            "job_style": "context",
            "schedulable": schedulable,
            "data_model": data,
            "submittable": submittable,
            "send_events": events,
            "control": control,
            "key_concurrency": key_concurrency,
            "key_rate": key_rate,
        }
        if options is not None:
            attributes["default_options"] = lambda _task, d, o: options(d, o)
        if timeout is not None:
            attributes["time_limit"] = timeout
        return shared_task(name=name, base=KeelTask, queue=queue, **attributes)(fn)

    return register
