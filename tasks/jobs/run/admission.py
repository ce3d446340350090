"""Before the claim: a delivery is held by its queue's pause, or admitted by its limits.

A recorded job of a paused queue is held first. Then the queue's global limits
(``tasks.jobs.run.limits``), its tenant's caps on running jobs (``tenant_caps``) and the
job's key limits (``key_limits``) are waited out before the claim, so that waiting costs
no attempt: a job held by one goes back to the durable delayed set and this delivery is
acknowledged; a job its key's strategy supersedes is cancelled. A run that says its
service limits it (``RateLimited``) holds its key's rate for the jobs after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from celery.exceptions import Ignore
from sqlalchemy.orm import Session

from tasks.jobs.calls.celery_task import CeleryTask
from tasks.jobs.end import cancel
from tasks.jobs.intake import pauses
from tasks.jobs.intake.messages import KEY_HEADER, TENANT_HEADER
from tasks.jobs.model.errors import RateLimited
from tasks.jobs.model.models import State
from tasks.jobs.run import delivery, key_limits, limits, tenant_caps
from tasks.jobs.store import runs, upkeep
from tasks.jobs.store.jobs import CancelledJob
from tasks.platform.db import STORE_UNAVAILABLE, transaction

log = logging.getLogger(__name__)

Done = TypeVar("Done")


def hold_if_paused(task: CeleryTask) -> None:
    """A recorded job of a paused queue is held (``tasks.jobs.intake.pauses``) before its
    queue's limits are asked: a limit would park it to delayed, and the promoter would
    publish it again and again while the pause lasts. A message without a record is
    recorded first, then held (``tasks.jobs.run.claim``)."""
    if not delivery.recorded(task):
        return
    try:
        if not pauses.queue_paused(delivery.queue(task)):
            return
        found = pauses.hold_delivery(task.request.id)
    except STORE_UNAVAILABLE as exc:
        delivery.requeue_while_store_unavailable(task, exc)
    delivery.ignore_if_held(task, found)


def admit(task: CeleryTask, args: Any, kwargs: Any) -> limits.Admission:
    """Wait out the queue's global limits, its tenant's caps on running jobs and the job's
    key limits before claiming, so waiting costs no attempt.

    A held job goes back to the durable delayed set (the promoter, or its key's
    line, publishes it again) and this delivery is acknowledged: nothing is
    held in worker memory, and a worker dying here loses nothing. A
    delivery without a record is recorded first, or acknowledging it
    would lose it. A job its key's strategy supersedes is cancelled.
    """
    try:
        queue = delivery.queue(task)
        admission = limits.admit(queue)
        try:
            data, given = key_data(task, kwargs), key_given(task)
            tenant_caps.admit(admission, given.tenant, queue, task.request.id)
            key_limits.admit(admission, task, data, task.request.id, given)
        except BaseException:
            limits.release(admission)
            raise
        return admission
    except limits.LimitReached as held:
        _park_held(task, held, args, kwargs)
    except key_limits.Superseded as superseded:
        _cancel_superseded(task, str(superseded), args, kwargs)
    except STORE_UNAVAILABLE as exc:  # a key limit reads the record
        delivery.requeue_while_store_unavailable(task, exc)


def key_data(task: CeleryTask, kwargs: Any) -> dict[str, Any]:
    """What the job's keys are read from: its data; a Celery-style task's keyword
    arguments (a recorded job's message carries its data: ``{"args", "kwargs"}``)."""
    named = dict(kwargs or {})
    if task.job_style == "context" or not delivery.recorded(task):
        return named
    inner = named.get("kwargs")
    return dict(inner) if isinstance(inner, dict) else {}


def key_given(task: CeleryTask) -> key_limits.Given:
    """The job's tenant and its call's concurrency key, as its message carries them: only a
    Keel message's (one sent without Keel is a system job's, whatever its headers say)."""
    if not delivery.recorded(task):
        return key_limits.Given()
    tenant, key = (getattr(task.request, h, None) for h in (TENANT_HEADER, KEY_HEADER))
    return key_limits.Given(
        tenant=tenant if isinstance(tenant, str) else None,
        concurrency_key=key if isinstance(key, str) and key else None,
    )


def hold_limiter(task: CeleryTask, limited: RateLimited, kwargs: Any) -> None:
    """The handler said its service limits it: no job of its key (or queue) starts
    until then, on any worker."""
    try:
        held = key_limits.rate_limited(
            task, key_data(task, kwargs), delivery.queue(task), limited, key_given(task)
        )
    except Exception:  # the job still waits; the others may try the service meanwhile
        log.warning("could not hold the rate limit of %s", task.name, exc_info=True)
        return
    if not held:
        log.info(
            "%s: rate limited for %d ms, but it has no %s rate limit to hold: only the job waits",
            task.name,
            limited.delay_ms,
            limited.scope,
        )


def _park_held(task: CeleryTask, held: limits.LimitReached, args: Any, kwargs: Any) -> NoReturn:
    job_id = task.request.id
    try:
        _on_its_record(task, args, kwargs, lambda s: upkeep.park(s, [job_id], held.wait_s))
    except STORE_UNAVAILABLE as exc:
        delivery.requeue_while_store_unavailable(task, exc)
    if held.after_park is not None:
        try:
            held.after_park()
        except Exception:  # the parked job asks again when due: a wait, not a loss
            log.warning("could not wake the next job of a key", exc_info=True)
    delivery.announce_ignored(task, f"held by its {held.reason} limit; it runs again later")
    raise Ignore() from None


def _cancel_superseded(task: CeleryTask, reason: str, args: Any, kwargs: Any) -> NoReturn:
    """A job of its key runs (``cancel_newest``): this one is cancelled, not run."""
    job_id = task.request.id

    def cancelled(session: Session) -> list[CancelledJob]:
        return cancel.cancel_in(session, [job_id], [State.WAITING], actor="key", reason=reason)

    try:
        done = _on_its_record(task, args, kwargs, cancelled)
    except STORE_UNAVAILABLE as exc:
        delivery.requeue_while_store_unavailable(task, exc)
    cancel.announce(done, by="key")
    delivery.announce_ignored(task, reason)
    raise Ignore() from None


def _on_its_record(
    task: CeleryTask, args: Any, kwargs: Any, change: Callable[[Session], Done]
) -> Done:
    """``change`` made to the delivery's record, in a transaction of its own.

    A message sent without Keel is recorded first, in the same transaction. A Keel
    message's record that ``change`` did not find may have been committed since (a canvas
    child is published inside the transaction that records it): once it is, ``change`` is
    made again, and what it did is the answer.
    """
    with transaction() as session:
        recorded = delivery.recorded(task)
        if not recorded:
            delivery.record_on_arrival(task, session, args, kwargs)
        done = change(session)
    if not done and recorded and runs.await_insert(task.request.id):
        with transaction() as session:
            done = change(session)
    return done
