"""jobs: indexes for the default retention's sweep

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 19:30:00.000000

Finished records whose job sets no ``removeOnComplete`` / ``removeOnFail`` of its own are
deleted once older than the default ages (``tasks.jobs.upkeep.retention``). The sweep reads
them oldest first through these partial indexes, which hold only such records.

An expand step: the previous release neither reads nor needs them. Built without
``CONCURRENTLY`` (Alembic runs in a transaction): on a table of millions of finished records,
build them by hand with ``CREATE INDEX CONCURRENTLY`` first, under the same names.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMPLETED = "state = 'completed' AND NOT (opts ? 'removeOnComplete')"
ENDED = "state IN ('failed', 'cancelled') AND NOT (opts ? 'removeOnFail')"


def upgrade() -> None:
    op.create_index(
        "ix_jobs_expiring_completed",
        "jobs",
        ["finished_on"],
        unique=False,
        postgresql_where=sa.text(COMPLETED),
        if_not_exists=True,
    )
    op.create_index(
        "ix_jobs_expiring_ended",
        "jobs",
        ["state", "finished_on"],
        unique=False,
        postgresql_where=sa.text(ENDED),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_expiring_ended", table_name="jobs", postgresql_where=sa.text(ENDED))
    op.drop_index(
        "ix_jobs_expiring_completed", table_name="jobs", postgresql_where=sa.text(COMPLETED)
    )
