"""Pages of job records, newest first, by keyset: each page starts after the last one's key.

A search narrows the same pages (``JobFilter``'s data, time and error fields): data by
containment, served by the GIN index ``ix_jobs_data`` (0026) — the rows it finds are the
tenant's matches, ordered after; times by ``ix_jobs_tenant_created``'s range; the failed
reason's text by reading the rows the other filters leave (a state of failed narrows it to
``ix_jobs_tenant_ended``).

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
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Select, bindparam, func, or_, select, tuple_
from sqlalchemy.orm import Session

from tasks.jobs.model.models import STATES, JobRecord, RetryAudit
from tasks.jobs.model.search import DataMatch

Selection = TypeVar("Selection", bound=Select[*tuple[Any, ...]])


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: whose (``tenant_id`` None: every tenant's and the system's), and which."""

    tenant_id: str | None = None
    user_id: str | None = None
    queue: str | None = None
    state: str | None = None
    name: str | None = None
    id_prefix: str | None = None  # e.g. the jobs one scheduler fired (``repeat:<digest>:``)
    hidden_names: tuple[str, ...] = ()  # left out (``keel jobs list``: quiet periodic jobs)
    # A search (``tasks.jobs.model.search``): every data condition holds; times are inclusive
    # bounds; ``error`` is text the failed reason contains, in any case.
    data: tuple[DataMatch, ...] = ()
    created_from: datetime | None = None
    created_to: datetime | None = None
    finished_from: datetime | None = None
    finished_to: datetime | None = None
    error: str | None = None

    @property
    def searching(self) -> bool:
        """Narrowed by a search (so counted on the records, not the counters)."""
        bounds = (self.created_from, self.created_to, self.finished_from, self.finished_to)
        return bool(self.data) or self.error is not None or bounds != (None,) * 4


@dataclass(frozen=True)
class PageKey:
    """Where a page ends: the last job's ``(created_at, id)``."""

    created_at: datetime
    id: str


def _filtered(query: Selection, where: JobFilter) -> Selection:
    columns = {
        JobRecord.tenant_id: where.tenant_id,
        JobRecord.user_id: where.user_id,
        JobRecord.queue: where.queue,
        JobRecord.name: where.name,
    }
    for column, value in columns.items():
        if value is not None:
            query = query.where(column == value)
    if where.state is not None:
        # Written into the statement, not bound: the planner then matches the partial
        # indexes of a state (``ix_jobs_tenant_ended``) whatever plan it keeps for it.
        query = query.where(
            JobRecord.state == bindparam("state", where.state, literal_execute=True)
        )
    if where.id_prefix is not None:
        query = query.where(JobRecord.id.startswith(where.id_prefix, autoescape=True))
    if where.hidden_names:
        query = query.where(JobRecord.name.not_in(where.hidden_names))
    return _searched(query, where)


def _searched(query: Selection, where: JobFilter) -> Selection:
    for match in where.data:
        query = query.where(or_(*(JobRecord.data.contains(obj) for obj in match.objects)))
    bounds = (
        (JobRecord.created_at, where.created_from, where.created_to),
        (JobRecord.finished_on, where.finished_from, where.finished_to),
    )
    for column, start, end in bounds:
        if start is not None:
            query = query.where(column >= start)
        if end is not None:
            query = query.where(column <= end)
    if where.error is not None:
        query = query.where(JobRecord.failed_reason.icontains(where.error, autoescape=True))
    return query


def state_counts(session: Session, where: JobFilter) -> dict[str, int]:
    """How many of the jobs ``where`` selects (its ``state`` aside) are in each state.

    Counted on the records, so it honours every filter (a user's own jobs, a
    name); ``counts.by_queue`` is the cheap tenant-wide figure.
    """
    query = _filtered(
        select(JobRecord.state, func.count()).group_by(JobRecord.state),
        replace(where, state=None),
    )
    found: dict[str, int] = dict.fromkeys(STATES, 0)
    found.update({state: int(n) for state, n in session.execute(query).all()})
    return found


def audits(session: Session, job_id: str) -> Sequence[RetryAudit]:
    """A job's manual retries, oldest first (the append-only audit trail)."""
    query = select(RetryAudit).where(RetryAudit.job_id == job_id).order_by(RetryAudit.id)
    return session.scalars(query).all()


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
