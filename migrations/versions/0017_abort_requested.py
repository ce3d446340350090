"""jobs.abort_requested_at: an owner or operator asked to abort the job's running run

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 00:00:00.000000

``DELETE /api/v1/jobs/<id>`` of an active job sets it (``tasks.jobs.end.abort``); the run's
end is then recorded as ``cancelled`` whatever it returned, and past the grace period
(``KEEL_ABORT_GRACE_S``) its worker stops it. The partial index holds only the jobs being
aborted, which each worker's maintenance reads every tick.

An expand step: a nullable column (no table rewrite) and a partial index on it, empty
until a job is aborted. Building it still reads the whole table under a lock that holds
back writes: on a large table, build it by hand first with ``CREATE INDEX CONCURRENTLY``
under the same name and definition (the step skips an existing one). A worker of the
previous release does not read the column: a run of it that an operator aborts ends as
the run itself ends, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("abort_requested_at", sa.DateTime(timezone=True)))
    op.create_index(
        "ix_jobs_aborting",
        "jobs",
        ["abort_requested_at"],
        unique=False,
        postgresql_where=sa.text("abort_requested_at IS NOT NULL AND state = 'active'"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_aborting", table_name="jobs")
    op.drop_column("jobs", "abort_requested_at")
