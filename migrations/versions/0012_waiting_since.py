"""jobs: an index for the age of each queue's oldest waiting job

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 20:10:00.000000

``/metrics`` serves ``keel_oldest_waiting_seconds{queue}``: how long the queue's oldest
waiting job has waited since it became due (``COALESCE(run_at, created_at)``). This partial
index holds only waiting jobs, so the read is one index probe per queue however long the
backlog.

An expand step: the previous release neither reads nor needs it. On a large table, build it
by hand first with ``CREATE INDEX CONCURRENTLY`` under the same name.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WAITING = "state = 'waiting'"


def upgrade() -> None:
    op.create_index(
        "ix_jobs_waiting_since",
        "jobs",
        ["queue", sa.text("COALESCE(run_at, created_at)")],
        unique=False,
        postgresql_where=sa.text(WAITING),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_waiting_since", table_name="jobs", postgresql_where=sa.text(WAITING))
