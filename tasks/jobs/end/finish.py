"""Finish: record how a run ended, and what follows in the same transaction.

A run ends completed, failed (for good, or delayed for a retry by BullMQ's
rules: attempts, backoff with jitter, ``UnrecoverableError``), or deferred
without using an attempt (``Defer``). Each is one guarded statement
(``store.runs``); a transition that is no longer ours (the job was taken
over) raises ``NotOurs`` and records nothing.

A run whose job an owner asked to abort records none of these: its statement is refused,
and the job ends ``cancelled`` instead (``tasks.jobs.end.abort``), said by ``Aborted``.

When a job reaches completed or failed, in the same transaction, its
simple-mode deduplication claim (if it has a rule) is released; retention (``removeOnComplete``
/ ``removeOnFail``) trims finished records of the same kind once that
transaction commits. The count is kept per (queue, tenant), and per job name
for system jobs (no tenant): a queue is shared, and one tenant's traffic must
never push another tenant's finished records out.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from tasks.jobs.end import abort, canvas, webhook_events
from tasks.jobs.end.ending import (
    ended,
    finished,
    retention,
    wake_deferred,
    wake_parent,
    wake_waiters,
)
from tasks.jobs.model import failures
from tasks.jobs.model.errors import ControlFlow, Defer, UnrecoverableError
from tasks.jobs.model.models import State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.observe import events, metrics
from tasks.jobs.store import runs, waits
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform.db import transaction, tried_again_if_rolled_back

log = logging.getLogger(__name__)


class NotOurs(ControlFlow):
    """The job was taken over (its lock ran out): this worker's outcome is not recorded."""

    code = "not_ours"


@dataclass(frozen=True)
class Retrying:
    """The run failed and the job runs again at ``at`` (the durable delayed set)."""

    at: datetime
    reason: str


def retry_delay_ms(opts: JobOptions, attempts_made: int, exc: BaseException) -> int | None:
    """Milliseconds until the next run after this failure, or ``None`` when it is final."""
    if isinstance(exc, UnrecoverableError):
        return None
    return opts.retry_in_ms(attempts_made + 1)


def _refused(claimed: ClaimedJob) -> NoReturn:
    """The run's end was refused: its job was being aborted (it ends cancelled now:
    ``Aborted``), or the run is no longer the job's (``NotOurs``)."""
    if abort.end_run(claimed):
        raise abort.Aborted(claimed.id)
    raise NotOurs(claimed.id)


def _one_statement(claimed: ClaimedJob, state: State) -> bool:
    """Whether recording this job's end is its one guarded statement (sent without
    BEGIN/COMMIT): no dedup claim to free, nothing its canvas triggers, no webhook
    delivery to add with it."""
    return (
        claimed.opts.deduplication is None
        and not canvas.triggers(claimed.celery_ctx)
        and claimed.parent_job_id is None
        and not webhook_events.wanted(claimed, state)
    )


def _complete(claimed: ClaimedJob, result: Any) -> runs.Completed | None:
    """Record success and what follows it in one transaction; ``None``: no longer ours."""
    with transaction() as session:
        done = runs.complete(session, claimed, result)
        if done is not None:
            finished(session, claimed, State.COMPLETED)
            webhook_events.announce(session, claimed, State.COMPLETED, result=result)
            canvas.completed(session, claimed, result)
            if claimed.parent_job_id is not None:
                wake_parent(session, claimed.parent_job_id)
            if done.awaited:
                wake_waiters(session, claimed.id)
    return done


def _record_completed(claimed: ClaimedJob, result: Any) -> tuple[runs.Completed, bool] | None:
    """Record success: the record's answer, and whether it was the statement alone (its
    retention trims after it) rather than a transaction with what follows it; ``None``
    refused."""
    # The statement alone when nothing else goes in its transaction; refused there when no
    # longer ours, or when another job waits for it (then recorded in a transaction).
    if _one_statement(claimed, State.COMPLETED):
        done = runs.complete_alone(claimed, result)
        if done is not None:
            return done, True
    done = _complete(claimed, result)
    return None if done is None else (done, False)


def completed(claimed: ClaimedJob, result: Any, duration_s: float | None = None) -> None:
    """Record success; its ``completed`` event carries the run's ``duration_s`` to the metrics,
    and tells Celery's result channel only when a caller waits on the result (``watched``).

    A write that Postgres rolled back (a deadlock's victim) is tried again
    (``tried_again_if_rolled_back``), before the trim that follows it: left to the lock's
    expiry, the job would run again."""
    try:
        recorded = tried_again_if_rolled_back(lambda: _record_completed(claimed, result))
        if recorded is None:
            _refused(claimed)
        done, alone = recorded
        if alone:
            trim = retention(claimed, State.COMPLETED)
            if trim is not None:
                trim()
    except BaseException:
        if duration_s is not None:  # the run happened: its duration counts all the same
            metrics.observe(claimed.queue, "duration", duration_s, claimed.name)
        raise
    observed = ("duration", duration_s) if duration_s is not None else None
    events.emit_job(claimed, "completed", observed=observed, news=done.watched, returnvalue=result)


def failed(
    claimed: ClaimedJob,
    exc: BaseException,
    *,
    by_rules: bool = True,
    retry_in_ms: int | None = None,
    data: dict[str, Any] | None = None,
) -> Retrying | None:
    """Record a failed run; ``Retrying`` when the job runs again, ``None`` when it failed.

    ``by_rules``: the job's options decide (attempts, backoff, ``UnrecoverableError``);
    otherwise the caller has decided — Celery's ``self.retry`` — and ``retry_in_ms``
    is the wait before the next run (``None``: this failure is final), and ``data``, if
    given, what the next run gets (``self.retry(args=, kwargs=)``).
    """
    delay = retry_delay_ms(claimed.opts, claimed.attempts_made, exc) if by_rules else retry_in_ms
    reason = failures.reason(exc)
    stack, kind = failures.stack(exc), failures.kind(exc)
    alone = _one_statement(claimed, State.FAILED)

    def record() -> runs.FailedRun:
        with transaction(one_statement=alone) as session:
            outcome = runs.fail(session, claimed, reason, stack, delay, data, kind, alone=alone)
            if outcome.final:  # announced below, with its attempts
                ended(session, claimed, State.FAILED, reason, announce=False, awaited=not alone)
        if alone and not outcome.ours:  # no longer ours, or another job waits for it
            with transaction() as session:
                outcome = runs.fail(session, claimed, reason, stack, delay, data, kind)
                if outcome.final:
                    ended(session, claimed, State.FAILED, reason, announce=False)
        return outcome

    outcome = tried_again_if_rolled_back(record)  # as ``completed``'s
    if not outcome.ours:
        _refused(claimed)
    made = claimed.attempts_made + 1
    if outcome.retry_at is None:
        events.emit_job(claimed, "failed", failedReason=reason, attemptsMade=made)
        return None
    events.emit_job(claimed, "retrying", failedReason=reason, attemptsMade=made)
    events.emit_job(claimed, "delayed", delay=delay)
    return Retrying(outcome.retry_at, reason)


# A deferral waiting for jobs tries this many times while one of them is being ended.
MARK_TRIES = 100
LOCK_NOT_AVAILABLE = "55P03"


def _defer(
    claimed: ClaimedJob,
    deferral: Defer,
    state: State,
    awaited: list[str],
    announce: Callable[[Session], None],
) -> bool:
    with transaction() as session:
        # The awaited rows first (``store.waits``): an end of one of them either committed
        # before (read here as ended) or waits for this transaction (and sees its waits).
        ended_all = waits.mark(session, awaited) if awaited else False
        done = runs.defer(session, claimed, deferral.delay_ms, state, str(deferral))
        if done:  # announced before a wake-up of it (``wake_parent``) is
            event.listen(session, "after_commit", announce, once=True)
            if awaited:
                wake_deferred(session, claimed.id, awaited, ended_all)
            elif state == State.WAITING_CHILDREN:
                waits.forget(session, claimed.id)  # an earlier wait's jobs no longer hold it
            if deferral.waiting_children:
                wake_parent(session, claimed.id)
    return done


def deferred(claimed: ClaimedJob, deferral: Defer) -> None:
    """Park the job until later without using an attempt (BullMQ's ``moveToDelayed``); one
    waiting for its children whose children have all ended already runs again at once."""
    waiting = deferral.waiting_children or bool(deferral.waiting_for)
    state = State.WAITING_CHILDREN if waiting else State.DELAYED

    def announce(_session: Session) -> None:
        events.emit_job(claimed, state, delay=deferral.delay_ms)

    awaited = [job_id for job_id in deferral.waiting_for if job_id != claimed.id]
    for tried in range(1, MARK_TRIES + 1):
        try:
            done = _defer(claimed, deferral, state, awaited, announce)
            break
        except OperationalError as exc:  # an awaited row is being ended: not waited for
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE or tried == MARK_TRIES:
                raise
            time.sleep(random.uniform(0.005, 0.05))
    if not done and abort.end_run(claimed):
        raise abort.Aborted(claimed.id)
