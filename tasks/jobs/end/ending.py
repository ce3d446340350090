"""How a job ends without a result — the one function every such path calls (``ended``).

A job ends failed for good or cancelled along several paths: a run failing
for good (``finish.failed``), a cancel or revoke (``cancel``), too many stalls
(``stalls``), a message no worker can run (``calls.signals``), one that
arrived without a record and was refused (``run.delivery``), and a chord's body
whose part ended so (``fail_body``, below). The statement that moves the
record is the store's; what follows it is here, once: the dedup claim freed,
retention trimmed after the commit, the chord body counting on the job failed
(recursively: a body can be a part) or, by the chord's ``on_child_failure``, counting
the part (``chord_parts``), the parent waiting for its children woken if this was the
last (``wake_parent``), the jobs waiting for this one woken if it was the last they
waited for (``wake_waiters``), the end posted to the tenant's webhook endpoints that take
it (``webhook_events``: delivery jobs, in this transaction), the end announced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from tasks.jobs.end import chord_parts, steps, webhook_events
from tasks.jobs.intake.celery_options import failure_policy
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.models import State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.observe import events
from tasks.jobs.store import canvas as canvas_store
from tasks.jobs.store import dedup, parents, upkeep, waits
from tasks.jobs.store import jobs as jobs_store
from tasks.jobs.store.jobs import ReadyJob
from tasks.jobs.store.upkeep import Partition
from tasks.platform.db import transaction

log = logging.getLogger(__name__)
_UNKNOWN = object()


def ended(
    session: Session,
    job: Any,
    state: State,
    reason: str,
    *,
    announce: bool = True,
    awaited: bool = True,
    **fields: Any,
) -> None:
    """The one way a job ends without a result (failed for good or cancelled), in the
    transaction whose statement moved it there (``store``): every path calls this — a run
    failing for good, a cancel or revoke, too many stalls, a message no worker can run,
    one that arrived without a record and was refused.

    It frees the dedup claim and trims by retention (``finished``), fails the chord body
    counting on the job (Celery's ``ChordError``: the body would otherwise wait for ever),
    and, once the transaction commits, announces the end as an event named after the
    state (``announce=False``: the caller announces it with more to say). ``awaited=False``:
    the caller knows no job waits for this one (its statement refused such a job).
    """
    finished(session, job, state)
    webhook_events.announce(session, job, str(state), reason=reason)
    _fail_chord(session, job, reason)
    _go_on_past(session, job, reason)
    parent = getattr(job, "parent_job_id", _UNKNOWN)
    if parent is _UNKNOWN:  # a record read without it
        parent = parents.parent_of(session, job.id)
    if parent:
        wake_parent(session, str(parent))
    if awaited:
        wake_waiters(session, job.id)
    if not announce:
        return
    if state == State.FAILED:
        fields = {"failedReason": reason, **fields}
    queue, job_id, name, tenant = job.queue, job.id, job.name, job.tenant_id
    event.listen(
        session,
        "after_commit",
        lambda _session: events.emit(queue, str(state), job_id, name, tenant=tenant, **fields),
        once=True,
    )


def finished(session: Session, job: Any, state: State) -> None:
    """In the finishing transaction: free the job's dedup claim; trim once it commits.

    Trimming inside the finishing transaction would not see jobs finishing
    concurrently (their rows are not committed yet), and two last jobs could
    each leave one record too many. After the commit every finish is visible.
    ``job`` is anything with the record's ``id, queue, name, tenant_id, opts``.
    """
    opts = _options(job)
    if opts.deduplication is not None:  # only a job with a rule ever holds a claim
        dedup.release(session, job.id)
    trim = retention(job, state)
    if trim is not None:
        event.listen(session, "after_commit", lambda _session: trim(), once=True)


def _options(job: Any) -> JobOptions:
    return job.opts if isinstance(job.opts, JobOptions) else JobOptions.from_stored(job.opts)


def retention(job: Any, state: State) -> Callable[[], None] | None:
    """What trims the finished records of ``job``'s kind once its end has committed
    (``removeOnComplete`` / ``removeOnFail``); ``None`` if it keeps them all."""
    keep = _options(job).retention(completed=state == State.COMPLETED)
    if keep is None:
        return None
    partition = Partition(job.queue, job.tenant_id, job.name)

    def trim() -> None:
        try:
            with transaction() as fresh:
                upkeep.trim(fresh, partition, state, keep.count, keep.age_s)
        except Exception:  # retention is best effort; the next finish trims again
            log.warning("could not trim %s records of %s", state, partition, exc_info=True)

    return trim


def _fail_chord(session: Session, job: Any, reason: str) -> None:
    """In the transaction that ends a job without a result — failed for good, stalled too
    often, cancelled or revoked: its chord's body fails too (Celery's ``ChordError``).

    ``job`` is anything with the record's ``id`` and ``celery_ctx``.
    """
    body_id = canvas_store.chord_body_id(job.celery_ctx)
    if body_id is not None:
        chord_part_failed(session, body_id, job.id, reason)


def _go_on_past(session: Session, job: Any, reason: str) -> None:
    """A chain's step ended without a result: the chain stops there (Celery's way), unless
    its next step's ``on_child_failure`` says to go on: ``ignore`` passes it the failure as
    its first argument, ``{"error": reason, "jobId": step}``, as a chord body gets it;
    ``remove`` calls it without the failed step's result. The rest of the chain follows
    it as usual."""
    chain = list((job.celery_ctx or {}).get("chain") or [])
    if not chain or not isinstance(chain[-1], dict):
        return
    step = chain.pop()  # Celery keeps a chain's remaining steps last-first
    try:
        policy = failure_policy(step.get("options") or {})
    except ValueError:  # sent by another app, unchecked: the end must not fail on it
        log.warning("job %s: unknown on_child_failure of its chain's next step", job.id)
        return
    if policy == "fail":
        return
    parent = job if hasattr(job, "user_id") and hasattr(job, "tenant_id") else None
    parent = parent or jobs_store.get(session, job.id)
    more = {"chain": chain} if chain else {}
    error = {"error": reason, "jobId": job.id}
    ready = steps.record(
        session, parent, step, error, f"{job.id}.next", more, pass_result=policy == "ignore"
    )
    if ready:
        publish_ready(session, ready)


def wake_parent(session: Session, parent_id: str) -> None:
    """In the transaction that ends a child (or defers its parent): publish the parent if it
    waits for its children and none is unfinished now (``store.parents``)."""
    ready = parents.wake(session, parent_id)
    _publish_woken(session, [ready] if ready is not None else [])


def wake_deferred(session: Session, waiter_id: str, awaited: list[str], ended_all: bool) -> None:
    """In the transaction that defers ``waiter_id`` waiting for ``awaited`` (which
    ``waits.mark`` locked first, and found all ended: ``ended_all``): record the waits, and
    publish it at once if they have all ended already."""
    waits.record(session, waiter_id, awaited)
    if not ended_all:
        return
    ready = waits.wake_self(session, waiter_id)
    _publish_woken(session, [ready] if ready is not None else [])


def wake_waiters(session: Session, awaited_id: str) -> None:
    """In the transaction that ends ``awaited_id``: publish the jobs that wait for it
    (``Defer(..., waiting_for=...)``) and for nothing else unfinished now (``store.waits``)."""
    _publish_woken(session, waits.wake_waiters(session, awaited_id))


def _publish_woken(session: Session, ready: list[ReadyJob]) -> None:
    if not ready:
        return
    sent = publish_ready(session, ready)
    announced = [(job.queue, "waiting", job.id, job.name, job.tenant_id) for job in sent]
    event.listen(session, "after_commit", lambda _s: events.emit_many(announced), once=True)


def chord_part_failed(session: Session, body_id: str, part_id: str, reason: str) -> None:
    """A chord's part ended without a result: by the chord's policy (``chord_parts``), the
    body fails, or counts the part and runs once its last part is in."""
    ready = chord_parts.part_failed(session, body_id, part_id, reason)
    if ready is None:
        fail_body(session, body_id, f"chord part {part_id} failed: {reason}")
    elif ready:
        publish_ready(session, ready)


def fail_body(session: Session, body_id: str, reason: str) -> None:
    """A chord's body that will never have all its parts' results fails without running,
    and ends like any other job (``ended``): a body that is itself a part of an outer
    chord fails that chord's body too."""
    body = canvas_store.fail_body(session, body_id, reason)
    if body is not None:
        ended(session, body, State.FAILED, reason)
