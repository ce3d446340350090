"""Pages of job records, newest first, by keyset: each page starts after the last one's key.

The key is ``(created_at, id)``: ``created_at`` is the adding transaction's
time, so jobs added together share it, and the id breaks the tie. A keyset
page costs the same however deep the client pages (an ``OFFSET`` would
re-read every row before it), and jobs added while a client pages through
appear before its first page instead of shifting later pages: nothing is
skipped or shown twice. The indexes ``ix_jobs_owner`` and
``ix_jobs_tenant_created`` serve a user's and a tenant's pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select, tuple_
from sqlalchemy.orm import Session

from tasks.jobs.models import JobRecord


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: whose (``tenant_id`` None: every tenant's and the system's), and which."""

    tenant_id: str | None = None
    user_id: str | None = None
    queue: str | None = None
    state: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class PageKey:
    """Where a page ends: the last job's ``(created_at, id)``."""

    created_at: datetime
    id: str


def _filtered(query: Select[Any], where: JobFilter) -> Select[Any]:
    columns = {
        JobRecord.tenant_id: where.tenant_id,
        JobRecord.user_id: where.user_id,
        JobRecord.queue: where.queue,
        JobRecord.state: where.state,
        JobRecord.name: where.name,
    }
    for column, value in columns.items():
        if value is not None:
            query = query.where(column == value)
    return query


def page(
    session: Session, where: JobFilter, after: PageKey | None, limit: int
) -> Sequence[JobRecord]:
    """Up to ``limit`` jobs matching ``where``, newest first, after ``after`` if given."""
    query = _filtered(select(JobRecord), where)
    if after is not None:
        key = tuple_(JobRecord.created_at, JobRecord.id)
        query = query.where(key < tuple_(after.created_at, after.id))
    query = query.order_by(JobRecord.created_at.desc(), JobRecord.id.desc()).limit(limit)
    return session.scalars(query).all()
