"""Who read every tenant's records: the audit of the dashboard's platform sessions.

A platform session (``keel ui-link --platform``) reads the pages of every tenant at once;
``record`` keeps each page it opens — who, which view, the path with its query, when — in
the append-only ``platform_views``, and ``newest`` reads them back (``keel audit views``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.jobs.observe.queries import iso
from tasks.jobs.store import platform_views as store
from tasks.platform.db import transaction


@dataclass(frozen=True)
class PlatformViewRead:
    """One page a platform session read."""

    id: int
    actor: str
    view: str
    path: str
    recorded_at: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "actor": self.actor,
            "view": self.view,
            "path": self.path,
            "recordedAt": self.recorded_at,
        }


def record(actor: str, view: str, path: str) -> None:
    """Keep that ``actor`` read ``view`` at ``path`` now (committed before it returns)."""
    with transaction() as session:
        store.record(session, actor, view, path)


def newest(actor: str | None = None, limit: int = 50) -> list[PlatformViewRead]:
    """The newest ``limit`` pages read (by ``actor``, or by anyone), newest first."""
    with transaction() as session:
        rows = store.newest(session, actor, limit)
        return [
            PlatformViewRead(row.id, row.actor, row.view, row.path, iso(row.recorded_at))
            for row in rows
        ]
