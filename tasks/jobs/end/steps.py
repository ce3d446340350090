"""One step a job's end triggers (a chain's next step, a link): recorded as a job in the
transaction that records the end, or, for a step that is not a Keel task, sent the Celery
way once it commits (``tasks.jobs.end.canvas``; a chain going on past a failed step by its
policy: ``tasks.jobs.end.ending``)."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

from celery import signature
from sqlalchemy import event
from sqlalchemy.orm import Session

from tasks.jobs.end.chord_parts import keel_task
from tasks.jobs.intake import tenancy
from tasks.jobs.intake.celery_options import (
    call_priority,
    canvas_context,
    job_options,
    with_options,
)
from tasks.jobs.model.models import State
from tasks.jobs.model.owner import Owner, acting_as
from tasks.jobs.observe import events
from tasks.jobs.store import jobs as jobs_store
from tasks.jobs.store.jobs import NewJob, ReadyJob
from tasks.platform import tracing
from tasks.platform.celery_app import app

log = logging.getLogger(__name__)


def record(
    session: Session,
    parent: Any,
    step: dict[str, Any],
    result: Any,
    fallback_id: str,
    more: dict[str, Any],
    *,
    pass_result: bool = True,
) -> list[ReadyJob]:
    """Record one triggered step (a Keel task; the record, waiting, for the caller to publish),
    or send it after the commit (anything else). ``parent`` is the job whose end triggers it,
    anything with the record's ``id, celery_ctx, tenant_id, user_id``; ``result`` goes first
    in the step's arguments unless the step is immutable or ``pass_result`` is false."""
    sig = signature(step, app=app)
    given = tuple(sig.args or ())
    args = given if sig.immutable or not pass_result else (result, *given)
    options = {
        **dict(sig.options or {}),
        **more,
        "parent_id": parent.id,
        "root_id": (parent.celery_ctx or {}).get("root_id") or parent.id,
    }
    task = keel_task(sig.task)
    owner = Owner(parent.tenant_id, parent.user_id or "") if parent.tenant_id else None
    if task is None:  # a group, chord or plain task: the Keel jobs in it keep the owner

        def send() -> None:
            with acting_as(owner) if owner is not None else nullcontext():
                sig.apply_async(args=args, **more)

        after_commit(session, send)
        return []
    data = task.data_for(args, sig.kwargs)
    opts = job_options(task, data, owner, options)  # its countdown, expires, job_options …
    ctx = canvas_context({**options, "priority": call_priority(task, options)})
    job = NewJob(
        id=str(options.get("task_id") or fallback_id),
        name=task.name,
        queue=str(options.get("queue") or task.job_queue()),
        data=data,
        tenant_id=parent.tenant_id,
        user_id=parent.user_id,
        opts=opts,
        celery_ctx=tracing.carried(with_options(ctx or None, opts)),
        priority=tenancy.rank(ctx.get("priority")),
    )
    if not jobs_store.insert(session, job):
        return []  # recorded already
    after_commit(session, lambda: events.emit_job(job, job.state))
    if job.state != State.WAITING:
        return []
    return [jobs_store.ready_job(job)]


def after_commit(session: Session, action: Any) -> None:
    def run(_session: Session) -> None:
        try:
            action()
        except Exception:  # the records are right; a lost event or plain send is logged
            log.warning("after-commit canvas step failed", exc_info=True)

    event.listen(session, "after_commit", run, once=True)
