"""Celery signal handlers of the job layer."""

from __future__ import annotations

import gc
import logging
from typing import Any

from celery.signals import task_revoked, task_unknown, worker_init, worker_process_init

from tasks import db
from tasks.db import transaction
from tasks.jobs import canvas, events, finish, revocations
from tasks.jobs.models import State
from tasks.jobs.store import runs

log = logging.getLogger(__name__)


@task_unknown.connect
def fail_unknown_job(
    sender: Any = None,
    name: str | None = None,
    id: str | None = None,
    message: Any = None,
    exc: BaseException | None = None,
    **kw: Any,
) -> None:
    """A message nobody can run fails its job loudly instead of vanishing."""
    if id is None or name is None:
        return
    queue = (message.delivery_info or {}).get("routing_key") if message is not None else None
    try:
        with transaction() as session:
            job = runs.fail_unsupported(session, id, name)
            if job is not None:
                finish.finished(session, job, State.FAILED)
                canvas.failed(session, job, f"unsupported job: {name}")
                queue = job.queue
    except Exception:
        log.exception("could not record unsupported job %s (%s)", id, name)
        return
    if job is not None:
        events.emit(queue or "unknown", "failed", id, name, failedReason=f"unsupported job: {name}")


@task_revoked.connect
def cancel_revoked_job(
    sender: Any = None, request: Any = None, terminated: bool = False, **kw: Any
) -> None:
    """A revoked (or expired) message was discarded: its job is cancelled, never run."""
    job_id = getattr(request, "id", None)
    if not job_id:
        return
    try:
        revocations.revoked_message(job_id, terminated=bool(terminated))
    except Exception:  # kept for the maintenance loop to try again
        log.exception("could not cancel revoked job %s yet", job_id)


@worker_init.connect
def freeze_before_fork(**kw: Any) -> None:
    """Keep the worker's imported objects out of the garbage collector before the pool forks.

    A prefork child shares its parent's memory until it writes to a page; the
    collector's passes over every object write to all of them, so each child
    would soon hold its own copy of the whole import graph. Frozen, they stay
    shared (the PSS that P4 measures; ``gc.freeze``'s documented use).
    """
    gc.collect()
    gc.freeze()


@worker_process_init.connect
def fresh_connections(**kw: Any) -> None:
    """Prefork children must not reuse the parent's database connections."""
    db.dispose()
