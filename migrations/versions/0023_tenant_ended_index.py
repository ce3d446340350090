"""ix_jobs_tenant_ended: a tenant's failed or cancelled jobs, newest first

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05 00:00:00.000000

A listing filtered by a state (the dashboard's "failed" filter, ``GET /api/v1/jobs?state=``)
walked the tenant's whole history newest first (``ix_jobs_tenant_created``) until it had a
page of that state: failures are few among a tenant's retained records, and it read them
all (``bench.growth``: 60x an empty table's time at 200,000 records). This partial index
holds failed and cancelled jobs only, each entered once, when it ends.

An expand step (on a large table, build it first with ``CREATE INDEX CONCURRENTLY`` under
the same name and definition: the step skips an existing one). A worker of the previous
release neither needs nor minds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_tenant_ended",
        "jobs",
        ["tenant_id", "state", "created_at", "id"],
        unique=False,
        postgresql_where=sa.text("state IN ('failed', 'cancelled')"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_ended", table_name="jobs")
