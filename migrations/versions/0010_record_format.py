"""jobs.format: the version of a job record's layout

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 07:00:00.000000

An expand step: the column has a server default, so the previous release's
inserts (which do not name it) write format 1, the only layout there is so
far. A release that changes what a record's JSON columns hold bumps
``tasks.jobs.model.formats.RECORD_FORMAT`` and writes the new number only once the
release before it reads that layout (see README, Upgrading).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds the column without rewriting the table, so this
    # runs in milliseconds under workers that keep claiming.
    op.add_column(
        "jobs", sa.Column("format", sa.SmallInteger(), server_default="1", nullable=False)
    )


def downgrade() -> None:
    op.drop_column("jobs", "format")
