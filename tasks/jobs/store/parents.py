"""Statements on a parent and its children: jobs a running job added with
``job.add_child`` (``jobs.parent_job_id``), and the parent waiting for them.

A parent that deferred itself ``waiting-children`` is woken (made waiting, for its
caller to publish) by the transaction that ends its last unfinished child, or by its own
deferral if its children have all ended already. Neither may see the other's change
still uncommitted and leave the parent asleep: each locks the parent's row first, in a
statement of its own and whatever its state (a lock conditioned on ``waiting-children``
would not wait for a deferral that has not committed yet: the row it reads is still
``active``), and counts the unfinished children in the next statement, whose snapshot
then holds whatever ended or deferred before it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.store.jobs import ReadyJob, ready_job

_PARENT_OF = text("SELECT parent_job_id FROM jobs WHERE id = :id")
_LOCK = text("SELECT state FROM jobs WHERE id = :id FOR UPDATE")
# A parent with no child at all is left to its timer (it waits for something else).
_WAKE = text(
    """
    UPDATE jobs SET state = 'waiting'
    WHERE id = :id AND state = 'waiting-children'
      AND EXISTS (SELECT 1 FROM jobs AS child WHERE child.parent_job_id = :id)
      AND NOT EXISTS (SELECT 1 FROM jobs AS child WHERE child.parent_job_id = :id
                      AND child.state NOT IN ('completed', 'failed', 'cancelled'))
      AND NOT EXISTS (  -- nor for a job it named (``store.waits``)
        SELECT 1 FROM job_waits AS w JOIN jobs AS awaited ON awaited.id = w.awaited_id
        WHERE w.waiter_id = :id AND awaited.state NOT IN ('completed', 'failed', 'cancelled'))
    RETURNING id, name, queue, data, celery_ctx, tenant_id, run_at, priority
    """
)
_CHILDREN = text(
    """
    SELECT id, name, state, result, failed_reason FROM jobs
    WHERE parent_job_id = :id ORDER BY created_at, id
    """
)


def parent_of(session: Session, job_id: str) -> str | None:
    return session.execute(_PARENT_OF, {"id": job_id}).scalar()


def wake(session: Session, parent_id: str) -> ReadyJob | None:
    """The parent, made waiting, if it waits for children and none is unfinished now (the
    caller publishes it); ``None`` otherwise."""
    if session.execute(_LOCK, {"id": parent_id}).scalar() != "waiting-children":
        return None
    row = session.execute(_WAKE, {"id": parent_id}).first()
    return ready_job(row) if row is not None else None


def children(session: Session, parent_id: str) -> list[dict[str, Any]]:
    """A parent's children, oldest first: id, name, state, result, failedReason."""
    rows = session.execute(_CHILDREN, {"id": parent_id}).all()
    return [
        {
            "id": row.id,
            "name": row.name,
            "state": row.state,
            "result": row.result,
            "failedReason": row.failed_reason,
        }
        for row in rows
    ]
