"""per-tenant retention, counts and live-job load

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 03:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "state IN ('waiting', 'active', 'delayed', 'waiting-children')"


def _count_trigger(with_tenant: bool) -> str:
    """The delta trigger of 0004, optionally keyed by tenant ('' for system jobs)."""
    cols = "queue, tenant_id, state" if with_tenant else "queue, state"
    old = (
        "OLD.queue, COALESCE(OLD.tenant_id, ''), OLD.state"
        if with_tenant
        else "OLD.queue, OLD.state"
    )
    new = (
        "NEW.queue, COALESCE(NEW.tenant_id, ''), NEW.state"
        if with_tenant
        else "NEW.queue, NEW.state"
    )
    return f"""
        CREATE OR REPLACE FUNCTION jobs_count_states() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO job_count_deltas ({cols}, n) VALUES ({new}, 1);
            ELSIF TG_OP = 'DELETE' THEN
                INSERT INTO job_count_deltas ({cols}, n) VALUES ({old}, -1);
            ELSIF OLD.state IS DISTINCT FROM NEW.state OR OLD.queue IS DISTINCT FROM NEW.queue THEN
                INSERT INTO job_count_deltas ({cols}, n) VALUES ({old}, -1), ({new}, 1);
            END IF;
            RETURN NULL;
        END $$
    """


def upgrade() -> None:
    # Counts per (queue, tenant, state): a tenant operator's queue health counts only
    # its own jobs, still without scanning the jobs table. Rebuilt from the records,
    # with writers held off, so counts and pending deltas stay consistent.
    op.execute("LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE")
    op.add_column(
        "job_count_deltas",
        sa.Column("tenant_id", sa.String(length=200), server_default="", nullable=False),
    )
    op.add_column(
        "job_counts",
        sa.Column("tenant_id", sa.String(length=200), server_default="", nullable=False),
    )
    op.drop_constraint("pk_job_counts", "job_counts", type_="primary")
    op.create_primary_key("pk_job_counts", "job_counts", ["queue", "tenant_id", "state"])
    op.execute(_count_trigger(with_tenant=True))
    op.execute("DELETE FROM job_count_deltas")
    op.execute("DELETE FROM job_counts")
    op.execute(
        "INSERT INTO job_counts (queue, tenant_id, state, n) "
        "SELECT queue, COALESCE(tenant_id, ''), state, count(*) FROM jobs "
        "GROUP BY queue, COALESCE(tenant_id, ''), state"
    )
    # Retention trims per (queue, tenant) — per job name for system jobs.
    op.drop_index(
        "ix_jobs_finished",
        table_name="jobs",
        postgresql_where=sa.text("state IN ('completed','failed')"),
    )
    op.create_index(
        "ix_jobs_finished",
        "jobs",
        ["queue", "tenant_id", "state", "finished_on"],
        unique=False,
        postgresql_where=sa.text("state IN ('completed','failed')"),
    )
    # A tenant's live jobs and backlog (quota and fair priority) without its finished ones.
    op.create_index(
        "ix_jobs_tenant_live",
        "jobs",
        ["tenant_id", "queue", "state"],
        unique=False,
        postgresql_where=sa.text(LIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_live", table_name="jobs", postgresql_where=sa.text(LIVE))
    op.drop_index(
        "ix_jobs_finished",
        table_name="jobs",
        postgresql_where=sa.text("state IN ('completed','failed')"),
    )
    op.create_index(
        "ix_jobs_finished",
        "jobs",
        ["queue", "state", "finished_on"],
        unique=False,
        postgresql_where=sa.text("state IN ('completed','failed')"),
    )
    op.execute("LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE")
    op.execute(_count_trigger(with_tenant=False))
    op.execute("DELETE FROM job_count_deltas")
    op.execute("DELETE FROM job_counts")
    op.drop_constraint("pk_job_counts", "job_counts", type_="primary")
    op.drop_column("job_counts", "tenant_id")
    op.create_primary_key("pk_job_counts", "job_counts", ["queue", "state"])
    op.execute(
        "INSERT INTO job_counts (queue, state, n) SELECT queue, state, count(*) FROM jobs GROUP BY queue, state"
    )
    op.drop_column("job_count_deltas", "tenant_id")
