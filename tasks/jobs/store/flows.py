"""Read-only statements for a flow's view: the records a job's flow names, as one viewer may
see them (``tasks.jobs.observe.flows`` puts them together).

Every statement is scoped to the viewer: a tenant's jobs (``user_id`` None: an operator,
every user's) or one user's. A record outside the scope is left out exactly as a missing
one is, so a flow never shows, nor counts, another tenant's (or another user's) jobs.
Reads go by primary key (the ids a chord's body or a chain's step names) or by
``ix_jobs_parent`` (a parent's children).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

_COLUMNS = "id, name, state, parent_job_id, celery_ctx, created_at"
_SCOPE = "tenant_id = :tenant AND (CAST(:user AS text) IS NULL OR user_id = :user)"
_BY_ID = text(f"SELECT {_COLUMNS} FROM jobs WHERE id = ANY(:ids) AND {_SCOPE}")
_CHILDREN = text(
    f"""
    SELECT {_COLUMNS} FROM jobs WHERE parent_job_id = :parent AND {_SCOPE}
    ORDER BY created_at, id LIMIT :limit
    """
)
_COUNT_CHILDREN = text(f"SELECT count(*) FROM jobs WHERE parent_job_id = :parent AND {_SCOPE}")
# A chord's parts once its body ran (its claim took the delivery's context, without
# ``chordParts``): the jobs of its group that name it as their chord's body, recorded
# within ``PARTS_WINDOW`` of it (a range of ``ix_jobs_tenant_created``, not a scan).
_PART_OF = f"""
    {_SCOPE} AND created_at BETWEEN :since AND :until
    AND celery_ctx ->> 'group' = :group
    AND celery_ctx -> 'chord' -> 'options' ->> 'task_id' = :body
"""
_PARTS = text(
    f"""
    SELECT {_COLUMNS} FROM jobs WHERE {_PART_OF}
    ORDER BY CASE WHEN jsonb_typeof(celery_ctx -> 'group_index') = 'number'
                  THEN CAST(celery_ctx ->> 'group_index' AS numeric) END, created_at, id
    LIMIT :limit
    """
)
_COUNT_PARTS = text(f"SELECT count(*) FROM jobs WHERE {_PART_OF}")
PARTS_WINDOW = timedelta(hours=1)  # a chord's parts are recorded as its body is sent


@dataclass(frozen=True)
class Viewer:
    """Whose records a flow may show: a tenant's (``user_id`` None) or one user's."""

    tenant_id: str
    user_id: str | None


@dataclass(frozen=True)
class FlowRecord:
    """What a flow's node shows of a job, and what links it to the others."""

    id: str
    name: str
    state: str
    parent_job_id: str | None
    celery_ctx: dict[str, Any]
    created_at: datetime | None = None


def _record(row: Any) -> FlowRecord:
    ctx = row.celery_ctx if isinstance(row.celery_ctx, dict) else {}
    return FlowRecord(row.id, row.name, row.state, row.parent_job_id, ctx, row.created_at)


def _scope(viewer: Viewer) -> dict[str, Any]:
    return {"tenant": viewer.tenant_id, "user": viewer.user_id}


def visible(session: Session, ids: Sequence[str], viewer: Viewer) -> dict[str, FlowRecord]:
    """The records of ``ids`` the viewer may see, by id (the others are absent)."""
    if not ids:
        return {}
    rows = session.execute(_BY_ID, {"ids": list(dict.fromkeys(ids)), **_scope(viewer)}).all()
    return {row.id: _record(row) for row in rows}


def children(
    session: Session, parent_id: str, viewer: Viewer, limit: int
) -> tuple[list[FlowRecord], int]:
    """A parent's children the viewer may see, oldest first (at most ``limit``), and how
    many there are of them in all."""
    scope = {"parent": parent_id, **_scope(viewer)}
    rows = session.execute(_CHILDREN, {**scope, "limit": limit}).all()
    total = (
        len(rows)
        if len(rows) < limit
        else int(session.execute(_COUNT_CHILDREN, scope).scalar_one())
    )
    return [_record(row) for row in rows], total


def chord_parts(
    session: Session, body: FlowRecord, group_id: str, viewer: Viewer, limit: int
) -> tuple[list[FlowRecord], int]:
    """The parts of the chord ``body`` (of group ``group_id``) the viewer may see, in the
    header's order (at most ``limit``), and how many there are of them in all: for a body
    whose record no longer lists its parts."""
    if body.created_at is None:
        return [], 0
    scope = {
        "group": group_id,
        "body": body.id,
        "since": body.created_at - PARTS_WINDOW,
        "until": body.created_at + PARTS_WINDOW,
        **_scope(viewer),
    }
    rows = session.execute(_PARTS, {**scope, "limit": limit}).all()
    if len(rows) < limit:
        return [_record(row) for row in rows], len(rows)
    return [_record(row) for row in rows], int(session.execute(_COUNT_PARTS, scope).scalar_one())
