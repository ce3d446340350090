"""The SQL of the platform views' audit (``platform_views``): a row per page a platform
session of the dashboard read, appended before the page is made; read newest first."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from tasks.jobs.model.models import PlatformView


def record(session: Session, actor: str, view: str, path: str) -> None:
    """Append one row (flushed in the caller's transaction)."""
    session.add(PlatformView(actor=actor, view=view, path=path))
    session.flush()


def newest(session: Session, actor: str | None, limit: int) -> Sequence[PlatformView]:
    """The newest ``limit`` rows (of ``actor``'s, or of everyone's), newest first."""
    query = select(PlatformView).order_by(PlatformView.id.desc()).limit(limit)
    if actor is not None:
        query = query.where(PlatformView.actor == actor)
    return session.scalars(query).all()
