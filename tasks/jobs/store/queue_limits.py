"""The SQL of queue limits set live (``tasks.jobs.run.live_limits``) and of their audit.

An override is a row of ``queue_limits``; every change (set or cleared) also appends a row
to ``queue_limit_changes`` in the same transaction, with the override before and after.
Changes of one queue are ordered by a transaction-scoped advisory lock, so the "before" of
each audit row is the "after" of the one that preceded it, even for a queue's first
override set twice at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import bindparam


@dataclass(frozen=True)
class Override:
    """A queue's limits set live: the fields given (``concurrency``, ``rate``), by whom, why."""

    queue: str
    limits: dict[str, Any]
    set_by: str
    reason: str
    set_at: datetime


@dataclass(frozen=True)
class Change:
    """One row of the audit: an override set (``after``) or cleared (``after`` None)."""

    id: int
    queue: str
    actor: str
    reason: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    recorded_at: datetime


def overrides(session: Session) -> list[Override]:
    """Every override in force, by queue (what each worker process reads every second)."""
    rows = session.execute(
        text("SELECT queue, limits, set_by, reason, set_at FROM queue_limits ORDER BY queue")
    ).all()
    return [Override(r.queue, r.limits, r.set_by, r.reason, r.set_at) for r in rows]


def _lock(session: Session, queue: str) -> dict[str, Any] | None:
    session.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('queue_limits'), hashtext(:queue))"),
        {"queue": queue},
    )
    found: dict[str, Any] | None = session.execute(
        text("SELECT limits FROM queue_limits WHERE queue = :queue"), {"queue": queue}
    ).scalar()
    return found


def _audit(session: Session, change: dict[str, Any]) -> Change:
    row = session.execute(
        text(
            "INSERT INTO queue_limit_changes (queue, actor, reason, before, after) "
            "VALUES (:queue, :actor, :reason, :before, :after) RETURNING id, recorded_at"
        ).bindparams(bindparam("before", type_=JSONB), bindparam("after", type_=JSONB)),
        change,
    ).one()
    return Change(id=row.id, recorded_at=row.recorded_at, **change)


def put(session: Session, queue: str, limits: dict[str, Any], by: str, reason: str) -> Change:
    """Set ``queue``'s override to ``limits`` (replacing any), audited."""
    before = _lock(session, queue)
    session.execute(
        text(
            "INSERT INTO queue_limits (queue, limits, set_by, reason) "
            "VALUES (:queue, :limits, :by, :reason) ON CONFLICT (queue) DO UPDATE "
            "SET limits = excluded.limits, set_by = excluded.set_by, "
            "reason = excluded.reason, set_at = now()"
        ).bindparams(bindparam("limits", type_=JSONB)),
        {"queue": queue, "limits": limits, "by": by, "reason": reason},
    )
    change = {"queue": queue, "actor": by, "reason": reason, "before": before, "after": limits}
    return _audit(session, change)


def clear(session: Session, queue: str, by: str, reason: str) -> Change | None:
    """Delete ``queue``'s override, audited; ``None`` (and no audit row) if there was none."""
    before = _lock(session, queue)
    if before is None:
        return None
    session.execute(text("DELETE FROM queue_limits WHERE queue = :queue"), {"queue": queue})
    change = {"queue": queue, "actor": by, "reason": reason, "before": before, "after": None}
    return _audit(session, change)


def changes(session: Session, queue: str | None, limit: int) -> list[Change]:
    """The newest ``limit`` audit rows (of ``queue``, or of every queue), newest first."""
    where = "" if queue is None else "WHERE queue = :queue"
    rows = session.execute(
        text(
            "SELECT id, queue, actor, reason, before, after, recorded_at "
            f"FROM queue_limit_changes {where} ORDER BY id DESC LIMIT :limit"
        ),
        {"queue": queue, "limit": limit},
    ).all()
    return [
        Change(r.id, r.queue, r.actor, r.reason, r.before, r.after, r.recorded_at) for r in rows
    ]
