"""job_waits and jobs.awaited: a job waiting for other jobs than its children

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 00:00:00.000000

A running job defers itself until named jobs have ended
(``Defer(..., waiting_for=[...])``, e.g. a campaign's chunk waiting for its generation's
group creator, which many chunks share); the transaction that records the last of them
ending publishes it (``tasks.jobs.store.waits``), the deferral's delay only a backstop.
``job_waits`` holds who waits for whom (deleted with the waiter); ``jobs.awaited`` marks
a job someone waits for, which its end then reads, so the end of every other job stays
one statement.

An expand step: a nullable column (no rewrite) and a new table. A worker of the previous
release neither writes nor reads them: a waiter whose awaited job it ends waits for its
backstop.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("awaited", sa.Boolean()))
    op.create_table(
        "job_waits",
        sa.Column("awaited_id", sa.String(200), primary_key=True),
        sa.Column(
            "waiter_id",
            sa.String(200),
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
    )
    op.create_index("ix_job_waits_waiter", "job_waits", ["waiter_id"])


def downgrade() -> None:
    op.drop_index("ix_job_waits_waiter", table_name="job_waits")
    op.drop_table("job_waits")
    op.drop_column("jobs", "awaited")
