"""Statements on a job waiting for other jobs than its children
(``Defer(..., waiting_for=[...])``): ``job_waits`` says who waits for whom, and
``jobs.awaited`` marks a job someone waits for.

The waiter is woken (made waiting, for its caller to publish) by the transaction that
ends the last unfinished job it waits for, or by its own deferral if they have all ended
already. Neither may miss the other's uncommitted change:

- The deferral locks and marks the awaited rows first (``mark``: a share lock, and an
  update of a row not marked yet), then parks itself and records its waits. An end that
  updated an awaited row before holds it until it commits: the mark does not wait for
  it (``NOWAIT``, which keeps a deferral from waiting on an end while it holds rows an
  end may wait on: a deadlock), and the caller tries again, then reads the row as ended
  and wakes its own job. An end after the mark waits for the deferral to commit, and
  then reads the mark on the row it updates (``runs.complete``: ``RETURNING awaited``)
  and the waits in its next statements.
- An end locks its waiters' rows first (in id order, whatever their state), then wakes
  those that wait for nothing unfinished, counting in a fresh statement: two awaited jobs
  ending at once cannot each see the other unfinished.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.store.jobs import ReadyJob, ready_job

ENDED_STATES = ("completed", "failed", "cancelled")

# Marked rows are share-locked (many waiters of one job do not queue behind each other);
# a row not marked yet is locked for its update. Neither waits for a lock held.
_LOCK_MARKED = text(
    "SELECT id, state, awaited FROM jobs WHERE id = ANY(:ids) ORDER BY id FOR SHARE NOWAIT"
)
_LOCK_UNMARKED = text("SELECT id FROM jobs WHERE id = ANY(:ids) ORDER BY id FOR UPDATE NOWAIT")
_SET_MARK = text("UPDATE jobs SET awaited = TRUE WHERE id = ANY(:ids)")
_FORGET = text("DELETE FROM job_waits WHERE waiter_id = :waiter")
_RECORD = text(
    """
    INSERT INTO job_waits (awaited_id, waiter_id)
    SELECT awaited, :waiter FROM unnest(CAST(:ids AS varchar[])) AS awaited
    ON CONFLICT DO NOTHING
    """
)
_WAITERS = text(
    """
    SELECT id FROM jobs
    WHERE id IN (SELECT waiter_id FROM job_waits WHERE awaited_id = :id)
    ORDER BY id FOR UPDATE
    """
)
# Woken: waiting for its named jobs (and children, if any: ``store.parents``), none of
# which is unfinished. A named job with no record (deleted) has ended.
_WAKE = text(
    """
    UPDATE jobs SET state = 'waiting'
    WHERE id = ANY(:ids) AND state = 'waiting-children'
      AND NOT EXISTS (
        SELECT 1 FROM job_waits AS w JOIN jobs AS awaited ON awaited.id = w.awaited_id
        WHERE w.waiter_id = jobs.id
          AND awaited.state NOT IN ('completed', 'failed', 'cancelled'))
      AND NOT EXISTS (
        SELECT 1 FROM jobs AS child WHERE child.parent_job_id = jobs.id
          AND child.state NOT IN ('completed', 'failed', 'cancelled'))
    RETURNING id, name, queue, data, celery_ctx, tenant_id, run_at, priority
    """
)
_DONE = text("DELETE FROM job_waits WHERE waiter_id = ANY(:ids)")


def mark(session: Session, awaited: Sequence[str]) -> bool:
    """Before a job defers itself waiting for ``awaited``: lock and mark them awaited;
    whether they have all ended (a job with no record has). A row locked by another
    transaction (an end being recorded) raises SQLAlchemy's ``OperationalError``
    (``lock_not_available``) at once: the caller rolls back and tries again."""
    rows = session.execute(_LOCK_MARKED, {"ids": sorted(set(awaited))}).all()
    unmarked = [row.id for row in rows if not row.awaited]
    if unmarked:
        session.execute(_LOCK_UNMARKED, {"ids": unmarked})
        session.execute(_SET_MARK, {"ids": unmarked})
    return all(row.state in ENDED_STATES for row in rows)


def forget(session: Session, waiter: str) -> None:
    """``waiter`` waits for no named job (any more)."""
    session.execute(_FORGET, {"waiter": waiter})


def record(session: Session, waiter: str, awaited: Sequence[str]) -> None:
    """What ``waiter`` waits for now (replacing what it waited for before)."""
    forget(session, waiter)
    session.execute(_RECORD, {"waiter": waiter, "ids": sorted(set(awaited))})


def wake_self(session: Session, waiter: str) -> ReadyJob | None:
    """A deferral whose awaited jobs have all ended: its job, made waiting (to publish)."""
    woken = _wake(session, [waiter])
    return woken[0] if woken else None


def wake_waiters(session: Session, awaited: str) -> list[ReadyJob]:
    """In the transaction that ends ``awaited``: its waiters that wait for nothing
    unfinished now, made waiting (for the caller to publish)."""
    waiters = session.execute(_WAITERS, {"id": awaited}).scalars().all()
    return _wake(session, list(waiters)) if waiters else []


def _wake(session: Session, waiters: list[str]) -> list[ReadyJob]:
    rows = session.execute(_WAKE, {"ids": waiters}).all()
    if rows:
        session.execute(_DONE, {"ids": [row.id for row in rows]})
    return [ready_job(row) for row in rows]
