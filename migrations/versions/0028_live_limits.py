"""queue_limits, queue_limit_changes: queue limits set live, and their audit

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07 10:30:00.000000

A row of ``queue_limits`` replaces fields of a queue's ``KEEL_QUEUE_LIMITS`` default; every
worker process reads the table again at most every second (``tasks.jobs.run.live_limits``).
``queue_limit_changes`` is append-only like ``job_actions``: the database refuses UPDATE,
DELETE and TRUNCATE.

An expand step: two new tables; the previous release neither reads nor writes them (its
workers keep enforcing ``KEEL_QUEUE_LIMITS`` alone: set limits live once every worker runs
this release).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "queue_limits",
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("limits", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("set_by", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "set_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("queue"),
    )
    op.create_table(
        "queue_limit_changes",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
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
        "ix_queue_limit_changes_queue", "queue_limit_changes", ["queue", "id"], unique=False
    )
    op.execute(
        """
        CREATE FUNCTION queue_limit_changes_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'queue_limit_changes is append-only (% refused)', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER queue_limit_changes_no_update_delete BEFORE UPDATE OR DELETE "
        "ON queue_limit_changes FOR EACH ROW EXECUTE FUNCTION queue_limit_changes_append_only()"
    )
    op.execute(
        "CREATE TRIGGER queue_limit_changes_no_truncate BEFORE TRUNCATE "
        "ON queue_limit_changes FOR EACH STATEMENT "
        "EXECUTE FUNCTION queue_limit_changes_append_only()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER queue_limit_changes_no_truncate ON queue_limit_changes")
    op.execute("DROP TRIGGER queue_limit_changes_no_update_delete ON queue_limit_changes")
    op.execute("DROP FUNCTION queue_limit_changes_append_only()")
    op.drop_index("ix_queue_limit_changes_queue", table_name="queue_limit_changes")
    op.drop_table("queue_limit_changes")
    op.drop_table("queue_limits")
