"""Canvas: what a job's end triggers, recorded in the transaction that records the end.

Celery fires a chain's next step, a task's links and a chord's count from the
worker's tracer, after the task returned: a worker killed in between loses
them, and a Redis restart loses a chord's count. For Keel tasks, Keel fires
them itself, inside the transaction that records the job completed (or
failed for good):

- the chain's next step and each ``link`` become job records (their ids are
  the ones Celery froze into the signatures, else derived from the parent's),
  and are published before that transaction commits, like promoted jobs
  (``tasks.jobs.intake.promote``): the end and what it triggers commit together, and
  a second end — impossible under the claim — would find the children there.
  A child's delivery that outruns the commit finds no record yet; its claim
  then waits for the inserting transaction and tries again
  (``store.runs.await_insert``), instead of dropping the delivery and leaving
  the child to the reconciler;
- a chord's part adds its result to the chord's body record
  (``tasks.jobs.store.canvas``); the part that brings the last result
  releases the body, with every result in the header's order; a part failing
  for good fails the body (Celery's ``ChordError``) without running it, unless the
  body's ``on_child_failure`` says to count it (``tasks.jobs.end.chord_parts``).

A step that is not a Keel task (a plain Celery task, a nested group or chord)
is sent the Celery way once the transaction commits. ``link_error`` stays
Celery's: it is kept on the record and fires when the job fails for good.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from celery.canvas import Signature
from sqlalchemy.orm import Session

from tasks.jobs.end import chord_parts, ending, steps
from tasks.jobs.intake import caller_transaction, tenancy
from tasks.jobs.intake.celery_options import (
    call_priority,
    canvas_context,
    failure_policy,
    with_options,
)
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.models import State
from tasks.jobs.model.owner import Owner, current_owner
from tasks.jobs.store import canvas as store
from tasks.jobs.store import jobs as jobs_store
from tasks.jobs.store.jobs import NewJob, ReadyJob
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform import tracing
from tasks.platform.db import transaction

log = logging.getLogger(__name__)


keel_task = chord_parts.keel_task
part_ended = chord_parts.part_ended
body_id_of = store.chord_body_id


def open_chord(task: Any, body: Signature, part_ids: list[str]) -> bool:
    """Record a chord's body before its parts are sent: ``waiting-children``, no due time.
    Inside ``in_transaction`` the body is recorded in the caller's transaction, as its
    parts are: a rollback leaves neither, a commit publishes the parts and the body waits.

    ``False`` if a job with the body's id exists already (recorded by its sender,
    as campaigns do): that chord is left to Celery's own count.
    """
    args, kwargs = list(body.args or ()), dict(body.kwargs or {})
    options = dict(body.options or {})
    ctx = canvas_context({**options, "priority": call_priority(task, options)})
    ctx.update(chordParts=part_ids, chordArgs=args, chordKwargs=kwargs)
    if body.immutable:  # ``.si()``: called with its own arguments, without the results
        ctx.update(chordImmutable=True)
    policy = failure_policy(options)
    if policy != "fail":
        ctx.update(chordOnFailure=policy)
    given = options.get("owner") or current_owner()
    owner = given if isinstance(given, Owner) else None
    opts = task.default_options({}, owner)
    job = NewJob(
        id=str(options["task_id"]),
        name=task.name,
        queue=str(options.get("queue") or task.job_queue()),
        data={},
        tenant_id=owner.tenant_id if owner else None,
        user_id=owner.user_id if owner else None,
        opts=opts,
        celery_ctx=tracing.carried(with_options(ctx, opts)),
        waiting_children=True,
        priority=tenancy.rank(ctx.get("priority")),
    )
    later = caller_transaction.deferred()  # on another database: with the parts, on commit
    if later is not None:
        later.defer(partial(_insert_body, job))
        return True
    caller = caller_transaction.current()
    with caller.statements() if caller is not None else transaction() as session:
        return jobs_store.insert(session, job)


def _insert_body(job: NewJob) -> bool:
    with transaction() as session:
        return jobs_store.insert(session, job)


def is_keel_chord(body_id: str) -> bool:
    with transaction() as session:
        return store.is_keel_chord(session, body_id)


def triggers(ctx: dict[str, Any] | None) -> bool:
    """Whether a job's end does anything here: a chain's next step, links, a chord to count
    (a failure: the chord body to fail)."""
    ctx = ctx or {}
    return bool(ctx.get("chain") or ctx.get("link") or body_id_of(ctx))


def completed(session: Session, claimed: ClaimedJob, result: Any) -> None:
    """In the completing transaction: record and publish what the job's end triggers."""
    ctx = claimed.celery_ctx or {}
    ready: list[ReadyJob] = []
    chain = list(ctx.get("chain") or [])
    if chain:
        step = chain.pop()  # Celery keeps a chain's remaining steps last-first
        more = {"chain": chain} if chain else {}
        ready += steps.record(session, claimed, step, result, f"{claimed.id}.next", more)
    for index, link in enumerate(ctx.get("link") or []):
        ready += steps.record(session, claimed, link, result, f"{claimed.id}.link{index}", {})
    body_id = body_id_of(ctx)
    if body_id:
        ready += part_ended(session, body_id, claimed.id, result)
    if ready:
        publish_ready(session, ready)


#: Bound parts counted per statement by ``count_bound_parts``.
BOUND_BATCH = 100


def count_bound_parts() -> int:
    """Count the chord parts that stand for another job (``store.canvas.bind_part``) once
    that job has ended: its result, or the body fails with its reason (maintenance runs
    this). A job with no record the body may read — trimmed, or another owner's — fails
    the body too: its result is not there to count."""
    with transaction() as session:
        bound = store.ended_bound_parts(session, BOUND_BATCH)
        ready: list[ReadyJob] = []
        for part in bound:
            if part.state == State.COMPLETED:
                ready += part_ended(session, part.body_id, part.part_id, part.result)
            elif part.state is None:
                why = f"chord part {part.part_id} stands for job {part.job_id}, which is not found"
                ending.fail_body(session, part.body_id, why)
            else:
                why = part.failed_reason or part.state
                ending.chord_part_failed(session, part.body_id, part.part_id, why)
        if ready:
            publish_ready(session, ready)
    return len(bound)
