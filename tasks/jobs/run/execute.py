"""Execute: ``KeelTask``, the Celery base class that claims a job's record and runs it,
and ``handler``, which registers a function as a job type's handler.

A delivery goes through four steps, each a module of ``tasks.jobs.run``: its
``admission`` (a paused queue holds it; its queue's, tenant's and key's limits admit
it or park it), its ``claim`` (the record decides: a delivery runs only if it can claim
its job), its run (``running``: the handler called, its lock renewed) and its
``outcome`` (how the run ended, recorded by ``tasks.jobs.end.finish``: failures follow
BullMQ's rules and retries go through the durable delayed set rather than Celery ETA
messages). A delivery that will not run is let go as ``delivery`` says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore
from pydantic import BaseModel

from tasks.jobs.calls.celery_task import CeleryTask
from tasks.jobs.end import abort
from tasks.jobs.model import registry
from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import quiet as quiet_jobs
from tasks.jobs.run import admission, claim, job_log, limits, outcome, running
from tasks.jobs.run.context import InProcessJob, JobContext

__all__ = ["JobContext", "KeelTask", "handler"]

log = logging.getLogger(__name__)


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
        admission.hold_if_paused(self)
        admitted = admission.admit(self, args, kwargs)
        try:
            return self._run_claimed(admitted, args, kwargs)
        except abort.Aborted:  # its end was recorded as the job's: cancelled
            self._announce_aborted()
            raise Ignore() from None
        finally:
            limits.release(admitted)

    def _run_claimed(self, admitted: limits.Admission, args: Any, kwargs: Any) -> Any:
        """Claim the job, run its handler, record how the run ended."""
        claimed = claim.claim(self, args, kwargs)
        run = running.start(self, admitted, claimed)
        try:
            result = run.call()
        except Exception as exc:
            outcome.raised(self, claimed, exc, kwargs)  # or raises what the run ends as
            raise
        finally:
            run.stop()
        outcome.returned(self, claimed, result, run.took)
        return result

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
