"""job_logs: the lines a handler writes with ``job.log()`` / ``self.log()``

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 13:40:00.000000

BullMQ's ``job.log()``: lines stored with the job, read by ``GET /api/v1/jobs/<id>/logs`` and
the dashboard's job page (``tasks.jobs.store.logs``). ``seq`` numbers a job's lines from 1;
only the newest ``KEEL_JOB_LOG_LINES`` are kept, and they go with the job's record.

An expand step: a new table; the previous release neither reads nor writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_logs",
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "logged_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "seq"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_table("job_logs")
