"""Celery's ways of sending and retrying a task, recorded as jobs (``CeleryTask``).

``.delay()``, ``.apply_async()``, signatures (``.s()``, ``.si()``) and canvas
primitives all end in ``Task.apply_async``; a Keel task's ``apply_async``
(``CeleryTask``, the base of ``tasks.jobs.run.execute.KeelTask``) makes the call
an ``add()``: the record is committed before any message, with the same owner,
options and deduplication rules as every other way in.

How Celery's options map:

- ``countdown`` / ``eta`` → the job's ``delay``: a durable delay in Postgres
  (state ``delayed``), published when due — never an ETA message held in a
  worker's memory.
- ``expires`` (seconds or a datetime) → ``expiresAt``: a job that has not
  started by then fails with "expired" instead of running.
- ``task_id`` → the job id (an existing job with that id is not added twice).
- ``queue`` → the job's queue (default: the task's).
- ``chain``, ``link``, ``link_error``, ``chord``, ``group_id``, ``group_index``,
  ``parent_id``, ``root_id`` → the canvas context kept on the record, so a
  retried or redelivered job still triggers its children and counts toward
  its chord.
- Keel's own: ``job_options`` (a ``JobOptions`` or its dict form: attempts,
  backoff, deduplication, retention …) and ``owner`` (an ``Owner``; or set
  one for a block of code with ``acting_as``). Inside a running tenant job
  the default owner is that job's (``running_for``), and its quota is not
  checked again, as for the job's chain steps and links. Otherwise, without
  an owner the job is a system job.
- ``headers`` are kept on the record (``celery_ctx``) and carried by every message
  of the job: the handler reads them as ``self.request.headers`` and
  ``self.request.<name>``, on every run, retries included.
- ``priority`` (else the task's ``priority``, else ``task_default_priority``) orders
  the job among its own party's jobs on its queue, in the configured broker's direction
  (Redis: 0 first; RabbitMQ: 9 first); the broker priority a message carries is still
  Keel's to set, from the party's load at or before the job's rank
  (``tasks.jobs.intake.tenancy``). ``retry``, ``retry_policy``, ``serializer`` and the
  like are accepted and have nothing to do: publishing is Keel's
  (``tasks.jobs.intake.enqueue``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import Celery, Task
from celery.exceptions import MaxRetriesExceededError, Retry
from celery.result import AsyncResult as CeleryResult  # the method below takes its name
from pydantic import BaseModel

from tasks.jobs.calls.async_result import KeelResult
from tasks.jobs.intake import tenancy
from tasks.jobs.intake.bulk import BulkJob, add_bulk
from tasks.jobs.intake.celery_options import call_priority, canvas_context, job_options
from tasks.jobs.intake.enqueue import AddedJob, add, new_job_id, publish_or_park
from tasks.jobs.model import owner as owner_context
from tasks.jobs.model import registry
from tasks.jobs.model.errors import UnrecoverableError
from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
from tasks.jobs.model.models import State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner
from tasks.jobs.store import canvas as canvas_store
from tasks.jobs.store import jobs as store
from tasks.platform import quotas
from tasks.platform.db import transaction

# The open ``recorded_together`` blocks' calls, and the innermost block's quota rule.
_TOGETHER: ContextVar[tuple[_Together, bool] | None] = ContextVar("keel_together", default=None)


def _queue_name(queue: Any) -> str | None:
    if queue is None:
        return None
    return str(getattr(queue, "name", queue))


def record(
    task: CeleryTask,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
) -> AddedJob:
    """Record (and publish, unless delayed) one Celery call of a Keel task."""
    data = task.data_for(args, kwargs)
    given = options.get("owner") or owner_context.acting()
    owner = given or owner_context.running()
    opts = job_options(task, data, owner, options)
    queue = _queue_name(options.get("queue")) or task.job_queue()
    ctx = canvas_context({**options, "priority": call_priority(task, options)})
    together = _TOGETHER.get()
    if together is not None and opts.deduplication is None:
        held, quota = together
        return held.hold(BulkJob(task.name, data, queue, opts, ctx or None), owner, quota)
    limits = quotas.current().jobs if given is not None else None
    added = add(task.name, data, queue=queue, opts=opts, owner=owner, limits=limits, ctx=ctx)
    if added.state == "existing":
        wake_if_waiting(added.job_id, ctx)
    return added


class _Together:
    """The calls held by ``recorded_together`` blocks, added when the outermost one ends."""

    def __init__(self) -> None:
        self.held: list[_Held] = []  # the first call naming each job id
        self.again: list[_Held] = []  # later calls naming a job held before them
        self.ids: set[str] = set()

    def hold(self, job: BulkJob, owner: Owner | None, quota: bool) -> AddedJob:
        if job.opts.job_id is None:
            opts = job.opts.model_copy(update={"job_id": new_job_id()})
            job = BulkJob(job.name, job.data, job.queue, opts, job.ctx)
        job_id = str(job.opts.job_id)
        if job_id in self.ids:  # as a second call would find it: existing, added again
            self.again.append(_Held(job, owner, quota))
        else:
            self.held.append(_Held(job, owner, quota))
            self.ids.add(job_id)
        state = State.DELAYED if job.opts.delay else State.WAITING
        return AddedJob(job_id, True, str(state))

    def mark(self) -> tuple[int, int]:
        return len(self.held), len(self.again)

    def drop_since(self, mark: tuple[int, int]) -> None:
        """Forget the calls held since ``mark`` (a block that raised); cancel the chord
        bodies that Celery recorded for them (``apply_chord`` runs before a chord's parts
        are sent), so no body waits for parts that never come."""
        dropped = self.held[mark[0] :] + self.again[mark[1] :]
        del self.held[mark[0] :], self.again[mark[1] :]
        self.ids = {str(item.job.opts.job_id) for item in self.held}
        _cancel_orphan_bodies(dropped, self.held + self.again)

    def add(self) -> None:
        """One ``add_bulk`` per owner (and quota rule), in call order. A call naming a job
        that exists already, or one held earlier in the block, is then made again on its
        own, so it is counted by its chord and woken as ``record`` would."""
        batches: dict[tuple[Any, bool], list[_Held]] = {}
        for item in self.held:
            key = (item.owner.tenant_id, item.owner.user_id) if item.owner else None
            batches.setdefault((key, item.quota), []).append(item)
        again = list(self.again)
        done: list[_Held] = []
        try:
            for items in batches.values():
                owner, quota = items[0].owner, items[0].quota
                limits = quotas.current().jobs if owner is not None and quota else None
                added = add_bulk([item.job for item in items], owner=owner, limits=limits)
                done += items
                again += [i for i, r in zip(items, added, strict=True) if r.state == "existing"]
        except BaseException:
            recorded = {id(item) for item in done}
            _cancel_orphan_bodies([i for i in self.held if id(i) not in recorded], done)
            raise
        for item in again:
            job = item.job
            once = add(
                job.name, job.data, queue=job.queue, opts=job.opts, owner=item.owner, ctx=job.ctx
            )
            if once.state == "existing":
                wake_if_waiting(once.job_id, job.ctx or {})


@dataclass(frozen=True)
class _Held:
    job: BulkJob
    owner: Owner | None
    quota: bool


def _cancel_orphan_bodies(dropped: list[_Held], kept: list[_Held]) -> None:
    """Cancel the Keel chord bodies that only ``dropped`` calls were parts of."""
    from tasks.jobs.end.cancel import cancel_many  # cancel → canvas → calls

    bodies = {canvas_store.chord_body_id(item.job.ctx) for item in dropped}
    bodies -= {canvas_store.chord_body_id(item.job.ctx) for item in kept}
    named = sorted(body for body in bodies if body is not None)
    if named:
        cancel_many(named, [State.WAITING_CHILDREN], by="recorded_together")


@contextmanager
def recorded_together(*, quota: bool = True) -> Iterator[None]:
    """Keel task calls made in this block (``.delay()``, ``apply_async``, the parts of a
    group or a chord) are recorded in one statement per owner and published in one pipeline
    when it ends (BullMQ's ``addBulk``; ``tasks.jobs.intake.bulk``). Inside, a call returns its
    result at once; the jobs exist only after the block. If the block raises, none of its
    calls is recorded, and the body of a chord sent in it (Celery records it when the chord
    is sent) is cancelled; a call with a deduplication rule is added at once, on its own,
    and stays. ``quota=False``: the owner's live-jobs quota is not checked (a campaign's
    chunks, admitted with the campaign). A nested block adds with the outermost one, but a
    nested block that raises drops its own calls.
    """
    outer = _TOGETHER.get()
    together = outer[0] if outer is not None else _Together()
    mark = together.mark()
    token = _TOGETHER.set((together, quota))
    try:
        yield
    except BaseException:
        together.drop_since(mark)
        raise
    finally:
        _TOGETHER.reset(token)
    if outer is None:
        together.add()


def wake_if_waiting(job_id: str, ctx: dict[str, Any]) -> None:
    """A call naming a job that is recorded and waiting sends it a wake-up message.

    Recording a job first and sending it through a canvas later (a chord over
    jobs added with ``publish_now=False``) is such a call; so is sending a
    ``task_id`` again, as Celery would. A job that already has a message gets
    a second one, which its claim refuses. The message goes behind what the
    job's party has on its queue, as an add's would (``tasks.jobs.intake.tenancy``):
    a campaign's hundreds of chunks queue behind their tenant's load, and a
    control job (``handler(control=True)``) goes to the front.

    The canvas the call names (its chord, chain, links) is written to the record
    before the message goes: the record is what publishes the job again if the
    message is lost before a worker claims it (Keel's transport keeps no copy of a
    recorded job's message: ``tasks.platform.transport``), or held by a pause or a limit. Not
    when another transaction holds the row to change it (a claim under way, or the caller's own
    open transaction, which waiting for would never end): the message alone carries it.
    """
    with transaction() as session:
        job = store.lock_if_free(session, job_id)
        held = job is None
        if held:
            job = store.get(session, job_id)
        if job is None or job.state != State.WAITING:
            return
        context = {**(job.celery_ctx or {}), **ctx}
        if not held and context != (job.celery_ctx or {}):
            job.celery_ctx = context
        ranked = [(job.id, job.tenant_id, job.queue, job.priority)]
        priority = tenancy.priorities(session, ranked)[job.id]
    publish_or_park(
        job.id, job.name, job.queue, job.data, context, priority=priority, tenant=job.tenant_id
    )


def in_process(request: Any) -> bool:
    """Whether this run is in the caller's process, not a worker's delivery: ``task.apply()``
    or ``task_always_eager`` (Celery's eager mode), or a task called as a function.

    Such a run is Celery's alone — no record, no servers: a project's unit tests run its
    tasks as they did before Keel (retries are Celery's, run at once, ``request.retries``
    counting them; ``apply()`` returns an ``EagerResult``).
    """
    return bool(request.is_eager or request.called_directly)


# ``max_retries=None`` (Celery: retry forever) is bounded: a job is retried at most this often.
MAX_RETRIES_CAP = 99


class RetryRequested(Retry):
    """``self.retry()`` of a Keel task: the next run is due in ``delay_ms`` (the delayed set)."""

    def __init__(
        self, exc: BaseException | None, delay_ms: int, data: dict[str, Any] | None = None
    ) -> None:
        super().__init__(exc=exc, when=delay_ms / 1000)
        self.delay_ms = delay_ms
        self.data = data  # new data for the next run (``retry(args=, kwargs=)``), or ``None``


class RetriesExhausted(Exception):
    """``self.retry()`` past ``max_retries``: the run's failure is final (``original``)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


def routed_queue(app: Celery, name: str) -> str:
    """The queue Celery's ``task_routes`` give ``name`` (else the default queue)."""
    route = app.amqp.router.route({}, name, (), {})
    queue = route.get("queue")
    return str(getattr(queue, "name", queue) or app.conf.task_default_queue)


class CeleryTask(Task):
    """A Keel task as Celery sees it: declared on binding, sent through the record,
    retried through the delayed set. ``tasks.jobs.run.execute.KeelTask`` runs it."""

    #: How the handler takes its job: ``"context"`` — ``run(job: JobContext)``, the job's
    #: data is a dict of named values (``handler``); ``"celery"`` — ``run(*args, **kwargs)``
    #: like any Celery task, the data is stored as ``{"args": [...], "kwargs": {...}}``.
    job_style = "celery"
    #: Who may schedule it, its data model, and whether tenants may add it over HTTP
    #: (``tasks.jobs.model.registry``); declared when Celery binds the task to the app.
    schedulable: registry.Schedulable = "system"
    data_model: type[BaseModel] | None = None
    submittable = False
    #: A control job goes to the front of its queue (``tasks.jobs.model.registry``).
    control = False
    #: Options every job of this task starts from (``JobOptions`` fields, BullMQ's names).
    default_job_options: dict[str, Any] | None = None
    #: At most N of one key's jobs run at once, and what a new one does meanwhile
    #: (``tasks.jobs.model.key_limits``; held across workers by ``tasks.jobs.run.key_limits``).
    key_concurrency: KeyConcurrency | None = None
    #: At most N starts of one key's jobs per window.
    key_rate: KeyRate | None = None

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Declare the job type, so schedulers, the API and health know it by name."""
        if cls.name:
            queue = getattr(cls, "queue", None) or routed_queue(app, cls.name)
            job_type = registry.JobType(
                cls.name, queue, cls.schedulable, cls.data_model, cls.submittable, cls.control
            )
            registry.declare(job_type)

    def job_queue(self) -> str:
        return str(getattr(self, "queue", None) or routed_queue(self.app, self.name))

    def default_options(self, data: dict[str, Any], owner: Owner | None) -> JobOptions:
        """The options a job of this task gets unless the call says otherwise; a Celery-style
        task's record shows its ``max_retries`` (``maxRetries``)."""
        given = dict(self.default_job_options or {})
        if self.job_style == "celery":
            given.setdefault("maxRetries", self.retry_limit())
        return JobOptions.model_validate(given)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> KeelResult:
        """Celery's result, whose ``.get()`` does not raise a parent's failure this job
        went on past by its ``on_child_failure`` policy (``tasks.jobs.calls.async_result``)."""
        return KeelResult(
            task_id, backend=self.backend, task_name=self.name, app=self._get_app(), **kwargs
        )

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> CeleryResult:
        """Record the job, then publish it: ``.delay()``, signatures and canvas land here.

        See ``tasks.jobs.calls.celery_task`` for how Celery's options map to the record.
        """
        if self.app.conf.task_always_eager:  # a user's tests: Celery's in-process run, no record
            return self.apply(
                args, kwargs, task_id=task_id, link=link, link_error=link_error, **options
            )
        options.update(task_id=task_id, link=link, link_error=link_error)
        added = record(self, args, kwargs, options)
        return self.AsyncResult(added.job_id)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Celery's ``self.retry``, through Keel's durable delayed set.

        ``request.retries`` is the record's ``attemptsMade``; past ``max_retries``
        (the task's, unless given; ``None``: at most ``MAX_RETRIES_CAP``) the run
        fails for good with ``exc`` (or ``MaxRetriesExceededError``), as it does at once
        when ``exc`` is an ``UnrecoverableError``. The wait is
        ``countdown``, else until ``eta``, else ``default_retry_delay``. New ``args`` or
        ``kwargs`` replace the recorded ones for the next run, as in Celery.
        """
        request = self.request
        if in_process(request):  # ``apply()``, ``task_always_eager``, a direct call: Celery's
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        if isinstance(exc, UnrecoverableError):  # ``autoretry_for=(Exception,)`` catches it too
            raise RetriesExhausted(exc) from exc
        if max_retries is None:  # the record's (the task's, or the call's ``job_options``)
            recorded = getattr(getattr(request, "keel_job", None), "opts", None)
            max_retries = getattr(recorded, "max_retries", None)
        if (request.retries or 0) >= self.retry_limit(max_retries):
            error = exc or MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{request.args} kwargs:{request.kwargs}"
            )
            raise RetriesExhausted(error) from error
        if countdown is None and eta is not None:
            due = eta if eta.tzinfo else eta.replace(tzinfo=UTC)
            countdown = (due - datetime.now(UTC)).total_seconds()
        if countdown is None:
            countdown = self.default_retry_delay
        data = None
        if args is not None or kwargs is not None:  # Celery runs the retry with these
            data = self.data_for(
                request.args if args is None else args, request.kwargs if kwargs is None else kwargs
            )
        requested = RetryRequested(exc, max(0, int(float(countdown or 0) * 1000)), data)
        if throw:
            raise requested
        # Celery sends the retry and lets the run go on: here the run's end is recorded
        # as this retry instead of a completion (``KeelTask`` reads it when the run returns).
        request.keel_retry = requested
        return requested

    def retry_limit(self, max_retries: int | None = None) -> int:
        """How many retries a job of this task gets: ``max_retries`` (the task's, unless
        given), at most ``MAX_RETRIES_CAP``."""
        limit = self.max_retries if max_retries is None else max_retries
        return MAX_RETRIES_CAP if limit is None else min(limit, MAX_RETRIES_CAP)

    def data_for(self, args: Any = (), kwargs: Any = None) -> dict[str, Any]:
        """The job data that Celery-style ``args``/``kwargs`` are recorded as."""
        positional: list[Any] = list(args or ())
        named: dict[str, Any] = dict(kwargs or {})
        if self.job_style == "context":
            if positional:
                raise TypeError(f"{self.name} takes its data as keyword arguments only")
            return named
        return {"args": positional, "kwargs": named}
