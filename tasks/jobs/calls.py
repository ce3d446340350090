"""Celery's ways of sending a task, recorded as jobs.

``.delay()``, ``.apply_async()``, signatures (``.s()``, ``.si()``) and canvas
primitives all end in ``Task.apply_async``; a Keel task's ``apply_async``
(``tasks.jobs.execute.KeelTask``) hands the call here, and it becomes an
``add()``: the record is committed before any message, with the same owner,
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
  one for a block of code with ``acting_as``). Without an owner the job is a
  system job.
- ``priority`` is Keel's to set (a tenant's load decides it); ``retry``,
  ``retry_policy``, ``serializer``, ``headers`` and the like are accepted
  and have nothing to do: publishing is Keel's (``tasks.jobs.enqueue``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from tasks import quotas
from tasks.db import transaction
from tasks.jobs.enqueue import AddedJob, add, publish_or_park
from tasks.jobs.models import State
from tasks.jobs.options import JobOptions
from tasks.jobs.owner import Owner
from tasks.jobs.store import jobs as store

if TYPE_CHECKING:
    from tasks.jobs.execute import KeelTask

_OWNER: ContextVar[Owner | None] = ContextVar("keel_owner", default=None)

# Canvas options kept on the record (Celery's option name → the context's key).
CANVAS_OPTIONS = {
    "chord": "chord",
    "group_id": "group",
    "group_index": "group_index",
    "chain": "chain",
    "parent_id": "parent_id",
    "root_id": "root_id",
}


@contextmanager
def acting_as(owner: Owner) -> Iterator[Owner]:
    """Jobs sent in this block (``.delay()`` included) belong to ``owner``."""
    token = _OWNER.set(owner)
    try:
        yield owner
    finally:
        _OWNER.reset(token)


def current_owner() -> Owner | None:
    """The owner set by ``acting_as`` around this call, if any."""
    return _OWNER.get()


def _moment(value: Any, now: datetime) -> datetime:
    """A Celery ``eta``/``expires`` value (datetime, ISO text, or seconds from now)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        return _moment(datetime.fromisoformat(value), now)
    if isinstance(value, timedelta):
        return now + value
    return now + timedelta(seconds=float(value))


def delay_ms(options: dict[str, Any], now: datetime) -> int:
    """Milliseconds until the job may run, from ``countdown`` or ``eta``."""
    if options.get("countdown") is not None:
        return max(0, math.ceil(float(options["countdown"]) * 1000))
    if options.get("eta") is not None:
        due = _moment(options["eta"], now)
        return max(0, math.ceil((due - now).total_seconds() * 1000))
    return 0


def _queue_name(queue: Any) -> str | None:
    if queue is None:
        return None
    return str(getattr(queue, "name", queue))


def job_options(
    task: KeelTask, data: dict[str, Any], owner: Owner | None, options: dict[str, Any]
) -> JobOptions:
    """The task's own options for this data, then what the call gives, then its delay."""
    base = task.default_options(data, owner).stored()
    given = options.get("job_options")
    if isinstance(given, JobOptions):
        base.update(given.stored())
    elif isinstance(given, dict):
        base.update(JobOptions.model_validate(given).stored())
    task_id = options.get("task_id")
    if task_id:
        base["jobId"] = str(task_id)
    now = datetime.now(UTC)
    wait = delay_ms(options, now)
    if wait:
        base["delay"] = wait
    if options.get("expires") is not None:
        base["expiresAt"] = _moment(options["expires"], now).isoformat()
    return JobOptions.model_validate(base)


def canvas_context(options: dict[str, Any]) -> dict[str, Any]:
    """The canvas options of a call, as the record keeps them (signatures as plain dicts)."""
    ctx: dict[str, Any] = {}
    for option, key in CANVAS_OPTIONS.items():
        if options.get(option) is not None:
            ctx[key] = options[option]
    for option in ("link", "link_error"):
        linked = options.get(option)
        if linked:
            ctx[option] = list(linked) if isinstance(linked, list | tuple) else [linked]
    plain: dict[str, Any] = _plain(ctx)
    return plain


def _plain(value: Any) -> Any:
    """Signatures are dicts; make them (and their nested parts) JSON-ready plain values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def record(
    task: KeelTask,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
) -> AddedJob:
    """Record (and publish, unless delayed) one Celery call of a Keel task."""
    data = task.data_for(args, kwargs)
    owner = options.get("owner") or _OWNER.get()
    opts = job_options(task, data, owner, options)
    queue = _queue_name(options.get("queue")) or task.job_queue()
    limits = quotas.current().jobs if owner is not None else None
    ctx = canvas_context(options)
    added = add(task.name, data, queue=queue, opts=opts, owner=owner, limits=limits, ctx=ctx)
    if added.state == "existing":
        wake_if_waiting(added.job_id, ctx)
    return added


def wake_if_waiting(job_id: str, ctx: dict[str, Any]) -> None:
    """A call naming a job that is recorded and waiting sends it a wake-up message.

    Recording a job first and sending it through a canvas later (a chord over
    jobs added with ``publish_now=False``) is such a call; so is sending a
    ``task_id`` again, as Celery would. A job that already has a message gets
    a second one, which its claim refuses.
    """
    with transaction() as session:
        job = store.get(session, job_id)
    if job is not None and job.state == State.WAITING:
        publish_or_park(job.id, job.name, job.queue, job.data, {**(job.celery_ctx or {}), **ctx})
