"""The SQL of key limit overrides (``tasks.jobs.run.live_key_limits``) and of their audit.

An override is a row of ``key_limit_overrides`` keyed by job type, tenant (``*``: any) and
key pattern; every change (set or cleared) also appends a row to ``key_limit_changes`` in
the same transaction, with the override before and after. Changes of one override are
ordered by a transaction-scoped advisory lock, so the "before" of each audit row is the
"after" of the one that preceded it, even for an override first set twice at once.
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
class KeyLimitRow:
    """An override in force: its fields given (``max_running``, ``rate``), by whom, why."""

    job_name: str
    tenant: str
    key: str
    limits: dict[str, Any]
    set_by: str
    reason: str
    set_at: datetime


@dataclass(frozen=True)
class KeyLimitChange:
    """One row of the audit: an override set (``after``) or cleared (``after`` None)."""

    id: int
    job_name: str
    tenant: str
    key: str
    actor: str
    reason: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    recorded_at: datetime


_COLUMNS = "job_name, tenant, key_pattern AS key"
_WHERE = "job_name = :job_name AND tenant = :tenant AND key_pattern = :key"


def overrides(session: Session, job_name: str | None = None) -> list[KeyLimitRow]:
    """Every override in force (of ``job_name``): what each worker process reads every second."""
    where = "" if job_name is None else "WHERE job_name = :job_name"
    rows = session.execute(
        text(
            f"SELECT {_COLUMNS}, limits, set_by, reason, set_at FROM key_limit_overrides "
            f"{where} ORDER BY job_name, tenant, key_pattern"
        ),
        {"job_name": job_name},
    ).all()
    return [KeyLimitRow(**row._asdict()) for row in rows]


def _lock(session: Session, job_name: str, tenant: str, key: str) -> dict[str, Any] | None:
    session.execute(
        text(
            "SELECT pg_advisory_xact_lock(hashtext('key_limit_overrides'),"
            " hashtext(json_build_array(CAST(:job_name AS text), CAST(:tenant AS text),"
            " CAST(:key AS text))::text))"
        ),
        {"job_name": job_name, "tenant": tenant, "key": key},
    )
    found: dict[str, Any] | None = session.execute(
        text(f"SELECT limits FROM key_limit_overrides WHERE {_WHERE}"),
        {"job_name": job_name, "tenant": tenant, "key": key},
    ).scalar()
    return found


def _audit(session: Session, change: dict[str, Any]) -> KeyLimitChange:
    row = session.execute(
        text(
            "INSERT INTO key_limit_changes"
            " (job_name, tenant, key_pattern, actor, reason, before, after)"
            " VALUES (:job_name, :tenant, :key, :actor, :reason, :before, :after)"
            " RETURNING id, recorded_at"
        ).bindparams(bindparam("before", type_=JSONB), bindparam("after", type_=JSONB)),
        change,
    ).one()
    return KeyLimitChange(id=row.id, recorded_at=row.recorded_at, **change)


def put(
    session: Session,
    job_name: str,
    tenant: str,
    key: str,
    limits: dict[str, Any],
    by: str,
    reason: str,
) -> KeyLimitChange:
    """Set the override of ``job_name``'s keys ``key`` of ``tenant`` (replacing any), audited."""
    before = _lock(session, job_name, tenant, key)
    named = {"job_name": job_name, "tenant": tenant, "key": key}
    session.execute(
        text(
            "INSERT INTO key_limit_overrides"
            " (job_name, tenant, key_pattern, limits, set_by, reason)"
            " VALUES (:job_name, :tenant, :key, :limits, :by, :reason)"
            " ON CONFLICT (job_name, tenant, key_pattern) DO UPDATE"
            " SET limits = excluded.limits, set_by = excluded.set_by,"
            " reason = excluded.reason, set_at = now()"
        ).bindparams(bindparam("limits", type_=JSONB)),
        {**named, "limits": limits, "by": by, "reason": reason},
    )
    change = {**named, "actor": by, "reason": reason, "before": before, "after": limits}
    return _audit(session, change)


def clear(
    session: Session, job_name: str, tenant: str, key: str, by: str, reason: str
) -> KeyLimitChange | None:
    """Delete an override, audited; ``None`` (and no audit row) if there was none."""
    before = _lock(session, job_name, tenant, key)
    if before is None:
        return None
    named = {"job_name": job_name, "tenant": tenant, "key": key}
    session.execute(text(f"DELETE FROM key_limit_overrides WHERE {_WHERE}"), named)
    change = {**named, "actor": by, "reason": reason, "before": before, "after": None}
    return _audit(session, change)


def changes(session: Session, job_name: str | None, limit: int) -> list[KeyLimitChange]:
    """The newest ``limit`` audit rows (of ``job_name``, or of every job type), newest first."""
    where = "" if job_name is None else "WHERE job_name = :job_name"
    rows = session.execute(
        text(
            f"SELECT id, {_COLUMNS}, actor, reason, before, after, recorded_at"
            f" FROM key_limit_changes {where} ORDER BY id DESC LIMIT :limit"
        ),
        {"job_name": job_name, "limit": limit},
    ).all()
    return [KeyLimitChange(**row._asdict()) for row in rows]
