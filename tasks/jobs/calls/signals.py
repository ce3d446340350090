"""Celery signal handlers of the job layer."""

from __future__ import annotations

import gc
import logging
from typing import Any

from celery.signals import task_revoked, task_unknown, worker_init, worker_process_init

from tasks.jobs.end import ending, revocations
from tasks.jobs.intake import tenancy
from tasks.jobs.model.models import State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.store import jobs as jobs_store
from tasks.jobs.store import runs
from tasks.jobs.store.jobs import NewJob
from tasks.platform import db
from tasks.platform.db import transaction

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
    """A message nobody can run fails its job loudly instead of vanishing.

    A message sent by name from another app has no record: it is recorded first (as a
    delivery of a known task would be, ``tasks.jobs.run.delivery``), with its canvas, so that
    a chord counting on it fails instead of waiting for ever.
    """
    if id is None or name is None:
        return
    queue = (message.delivery_info or {}).get("routing_key") if message is not None else None
    reason = f"unsupported job: {name}"
    try:
        with transaction() as session:
            _record_unknown(session, id, name, message, queue or "unknown")
            job = runs.fail_unsupported(session, id, name)
            if job is not None:
                ending.ended(session, job, State.FAILED, reason)
    except Exception:
        log.exception("could not record unsupported job %s (%s)", id, name)


def _record_unknown(session: Any, job_id: str, name: str, message: Any, queue: str) -> None:
    """Record a message no task of this worker knows, as it came (nothing if one exists)."""
    args: Any = []
    kwargs: Any = {}
    embed: dict[str, Any] = {}
    headers = dict(getattr(message, "headers", None) or {})
    try:
        decoded = message.decode() if message is not None else None
        if isinstance(decoded, list | tuple) and len(decoded) == 3:  # Celery's protocol 2
            args, kwargs, embed = decoded[0], decoded[1], dict(decoded[2] or {})
    except Exception:  # a body it cannot read is recorded without its arguments
        log.warning("job %s (%s): its message body could not be read", job_id, name)
    ctx = {
        "chord": embed.get("chord"),
        "chain": embed.get("chain"),
        "link": embed.get("callbacks"),
        "link_error": embed.get("errbacks"),
        "group": headers.get("group"),
        "group_index": headers.get("group_index"),
        "parent_id": headers.get("parent_id"),
        "root_id": headers.get("root_id"),
    }
    jobs_store.insert(
        session,
        NewJob(
            id=str(job_id),
            name=name,
            queue=queue,
            data={"args": list(args or []), "kwargs": dict(kwargs or {})},
            tenant_id=None,
            user_id=None,
            opts=JobOptions(),
            celery_ctx={k: v for k, v in ctx.items() if v not in (None, [], ())} or None,
            priority=tenancy.rank(None),  # (it fails at once: its place does not matter)
        ),
    )


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
