"""key_limit_overrides, key_limit_changes: a job type's key limits overridden live, audited

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07 12:00:00.000000

A row of ``key_limit_overrides`` replaces the ``max_running`` and/or the rate a job type
declares (``KeyConcurrency``, ``KeyRate``) for the keys it matches: one tenant's or every
tenant's (``*``), one key or a pattern (``partner-*``). Every worker process reads the table
again at most every second (``tasks.jobs.run.live_key_limits``). ``key_limit_changes`` is
append-only like ``queue_limit_changes``: the database refuses UPDATE, DELETE and TRUNCATE.

An expand step: two new tables; the previous release neither reads nor writes them (its
workers keep the declared limits: override them once every worker runs this release).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "key_limit_overrides",
        sa.Column("job_name", sa.String(length=200), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("key_pattern", sa.String(length=200), nullable=False),
        sa.Column("limits", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("set_by", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "set_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("job_name", "tenant", "key_pattern"),
    )
    op.create_table(
        "key_limit_changes",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_name", sa.String(length=200), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("key_pattern", sa.String(length=200), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("before", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("after", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_key_limit_changes_job_name", "key_limit_changes", ["job_name", "id"], unique=False
    )
    op.execute(
        """
        CREATE FUNCTION key_limit_changes_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'key_limit_changes is append-only (% refused)', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER key_limit_changes_no_update_delete BEFORE UPDATE OR DELETE "
        "ON key_limit_changes FOR EACH ROW EXECUTE FUNCTION key_limit_changes_append_only()"
    )
    op.execute(
        "CREATE TRIGGER key_limit_changes_no_truncate BEFORE TRUNCATE "
        "ON key_limit_changes FOR EACH STATEMENT "
        "EXECUTE FUNCTION key_limit_changes_append_only()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER key_limit_changes_no_truncate ON key_limit_changes")
    op.execute("DROP TRIGGER key_limit_changes_no_update_delete ON key_limit_changes")
    op.execute("DROP FUNCTION key_limit_changes_append_only()")
    op.drop_index("ix_key_limit_changes_job_name", table_name="key_limit_changes")
    op.drop_table("key_limit_changes")
    op.drop_table("key_limit_overrides")
