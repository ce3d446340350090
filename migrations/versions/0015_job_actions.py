"""job_actions: the audit of an operator's edits of one job (its data, its delay, a promote)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 14:00:00.000000

Append-only like ``job_retry_audit``: the database refuses UPDATE, DELETE and TRUNCATE.
Rows outlive their job (no foreign key), so an edit stays on record after retention.

An expand step: a new table; the previous release neither reads nor writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("tenant_id", sa.String(length=200), nullable=True),
        sa.Column("action", sa.String(length=50), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("details", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_actions_job_id", "job_actions", ["job_id"], unique=False)
    op.execute(
        """
        CREATE FUNCTION job_actions_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'job_actions is append-only (% refused)', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER job_actions_no_update_delete BEFORE UPDATE OR DELETE "
        "ON job_actions FOR EACH ROW EXECUTE FUNCTION job_actions_append_only()"
    )
    op.execute(
        "CREATE TRIGGER job_actions_no_truncate BEFORE TRUNCATE "
        "ON job_actions FOR EACH STATEMENT EXECUTE FUNCTION job_actions_append_only()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_actions_no_truncate ON job_actions")
    op.execute("DROP TRIGGER job_actions_no_update_delete ON job_actions")
    op.execute("DROP FUNCTION job_actions_append_only()")
    op.drop_index("ix_job_actions_job_id", table_name="job_actions")
    op.drop_table("job_actions")
