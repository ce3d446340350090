"""jobs.parent_job_id: the job that added this one as its child and may wait for it

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 00:00:00.000000

A running job adds children (``job.add_child``) and waits for them with
``Defer(..., waiting_children=True)``; the transaction that records its last child's end
publishes it (``tasks.jobs.end.ending``), the deferral's delay only a backstop. The
partial index holds only children, which each child's end reads its siblings through.

An expand step: a nullable column and a partial index on it, empty until a job adds a
child (on a large table, build it first with ``CREATE INDEX CONCURRENTLY`` under the same
name and definition: the step skips an existing one). A worker of the previous release
neither writes nor reads it: a parent whose child it ends waits for its backstop.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("parent_job_id", sa.String(200)))
    op.create_index(
        "ix_jobs_parent_job",
        "jobs",
        ["parent_job_id"],
        unique=False,
        postgresql_where=sa.text("parent_job_id IS NOT NULL"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_parent_job", table_name="jobs")
    op.drop_column("jobs", "parent_job_id")
