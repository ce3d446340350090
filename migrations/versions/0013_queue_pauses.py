"""queue_pauses, held_jobs: paused queues, and the waiting jobs they hold

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 10:30:00.000000

A queue is paused for every tenant (``tenant_id`` ``""``) or for one tenant's jobs on it
(``tasks.jobs.intake.pauses``). A worker that takes a message of a paused job acknowledges
it and notes the job in ``held_jobs``; lifting the pause publishes the held jobs again.

An expand step: two new tables; the previous release neither reads nor needs them (its
workers run a paused queue's jobs: pause once every worker runs this release).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "queue_pauses",
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("tenant_id", sa.String(length=200), server_default="", nullable=False),
        sa.Column("paused_by", sa.String(length=200), nullable=True),
        sa.Column(
            "paused_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("queue", "tenant_id"),
        if_not_exists=True,
    )
    op.create_table(
        "held_jobs",
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("tenant_id", sa.String(length=200), server_default="", nullable=False),
        sa.Column(
            "held_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("job_id"),
        # A held job deleted (retention, removeOnFail) is no longer held.
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_held_jobs_queue", "held_jobs", ["queue", "tenant_id"], unique=False, if_not_exists=True
    )


def downgrade() -> None:
    op.drop_index("ix_held_jobs_queue", table_name="held_jobs")
    op.drop_table("held_jobs")
    op.drop_table("queue_pauses")
