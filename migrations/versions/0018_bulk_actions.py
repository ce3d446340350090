"""bulk_actions: an operator's action on every job a filter matches, and its progress

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 00:10:00.000000

One row per bulk action (``tasks.jobs.upkeep.bulk_actions``): who asked, why, the action,
its filter and scope, how many jobs it matched when asked and how many it has done. It is
the action's audit (one row, whatever the count) and its resumable state: the batches walk
the matching jobs in id order from ``cursor``, worked by whichever process holds the row,
each committing its jobs, its count and the cursor together; ``worked_at`` and
``last_error`` let a failing action wait its turn behind the others.

An expand step: a new table; the previous release neither reads nor writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bulk_actions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("tenant_id", sa.String(length=200), nullable=True),
        sa.Column("filter", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("matched", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("cursor", sa.String(length=200), server_default="", nullable=False),
        sa.Column("worked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('running', 'done')", name="bulk_state"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_bulk_actions_running",
        "bulk_actions",
        ["worked_at"],
        unique=False,
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_index(
        "ix_bulk_actions_tenant", "bulk_actions", ["tenant_id", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_bulk_actions_tenant", table_name="bulk_actions")
    op.drop_index("ix_bulk_actions_running", table_name="bulk_actions")
    op.drop_table("bulk_actions")
