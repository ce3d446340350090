"""The end of a run: what the handler returned or raised, recorded by ``tasks.jobs.end.finish``.

A result completes the job. What the handler raised says what happens next: ``Defer``
runs it again later without using an attempt; ``self.retry()`` retries it when it said;
exhausted retries fail it for good; Celery's ``Reject`` is a retry at once if it asks to
be requeued (bounded like one); any other exception fails it by the job's rules, which
may retry it through the durable delayed set. A retry reaches Celery as its ``Retry``
(state RETRY, no message sent). A run whose lock was taken over by another worker records
nothing; a run being aborted ends ``cancelled`` (``tasks.jobs.end.abort``).
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Ignore, Reject, Retry

from tasks.jobs.calls.celery_task import CeleryTask, RetriesExhausted, RetryRequested
from tasks.jobs.end import abort, finish
from tasks.jobs.model.errors import Defer, RateLimited
from tasks.jobs.run import admission, delivery
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform import tracing
from tasks.platform.db import STORE_UNAVAILABLE


class UnrecordedEnd(Exception):
    """A run ended but its result, or what its end triggers, could not be recorded."""


_BY_RULES: Any = object()  # a failure retried, or not, by the job's options


def returned(task: CeleryTask, claimed: ClaimedJob, result: Any, took: float | None) -> None:
    """The handler returned ``result`` in ``took`` seconds: the job is completed."""
    try:
        with tracing.span("keel.finish", {"keel.job.end": "completed"}):
            finish.completed(claimed, result, took)
    except finish.NotOurs:
        delivery.announce_ignored(task, "taken over by another worker; this result is not recorded")
        raise Ignore() from None
    except STORE_UNAVAILABLE:
        raise  # the record stays active: its lock runs out and the run is tried again
    except abort.Aborted:
        raise  # recorded: the job was being aborted, and ended cancelled
    except Exception as exc:
        # The run happened but its end cannot be recorded (a result JSON cannot hold, a
        # chain step its task cannot take): left active, the job would stall and run
        # again, and again fail to record. It fails for good, saying why.
        failed(
            task, claimed, UnrecordedEnd(f"its end could not be recorded: {exc}"), retry_in_ms=None
        )
        raise
    # Its chain's next step and its links were recorded with its end (tasks.jobs.end.canvas):
    # Celery's tracer must not send them a second time.
    task.request.chain = None
    task.request.callbacks = None


def raised(task: CeleryTask, claimed: ClaimedJob, exc: Exception, kwargs: Any) -> None:
    """The handler raised ``exc`` (called while it is handled): the run's end is recorded.

    Raises what Celery is to see instead of ``exc`` — ``Ignore`` for a deferral,
    ``Retry`` for a retry, the original error of exhausted retries, a ``Reject`` that does
    not requeue — or returns, and the caller raises ``exc`` itself.
    """
    if isinstance(exc, Defer):
        if isinstance(exc, RateLimited):
            admission.hold_limiter(task, exc, kwargs)
        finish.deferred(claimed, exc)
        delivery.announce_ignored(task, f"deferred: {exc}")
        raise Ignore() from None
    if isinstance(exc, RetryRequested):
        failed(task, claimed, exc.exc or exc, exc.delay_ms, data=exc.data)
    elif isinstance(exc, RetriesExhausted):
        failed(task, claimed, exc.original, retry_in_ms=None)
        raise exc.original from None
    elif isinstance(exc, Reject):
        _rejected(task, claimed, exc)
    else:
        failed(task, claimed, exc)


def _rejected(task: CeleryTask, claimed: ClaimedJob, rejected: Reject) -> None:
    """Requeued: run again at once, as Celery would, but a requeue is a retry here, bounded
    like one (``max_retries``): a message that always rejects ends failed."""
    if rejected.requeue and claimed.attempts_made < task.retry_limit():
        failed(task, claimed, rejected, retry_in_ms=0)
        return
    failed(task, claimed, rejected, retry_in_ms=None)
    raise Reject(rejected.reason, requeue=False) from None  # not back to the broker


def failed(
    task: CeleryTask,
    claimed: ClaimedJob,
    exc: BaseException,
    retry_in_ms: Any = _BY_RULES,
    data: dict[str, Any] | None = None,
) -> None:
    """Record the failure; a retry is Celery's ``Retry`` (state RETRY, no message sent).

    By the job's options, or — ``retry_in_ms`` given — as ``self.retry`` decided.
    """
    by_rules = retry_in_ms is _BY_RULES
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
        delivery.announce_ignored(
            task, "taken over by another worker; this failure is not recorded"
        )
        raise Ignore() from None
    if retrying is not None:
        raise Retry(retrying.reason, exc=exc, when=retrying.at)
