"""platform_views: the audit of the pages a platform session read

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-10 00:00:00.000000

A dashboard session of the platform role (``keel ui-link --platform``) reads every tenant's
records; each page, partial or stream it opens appends a row here (who, which view, the path
with its query, when) before the answer is made. Append-only like ``key_limit_changes``:
the database refuses UPDATE, DELETE and TRUNCATE.

An expand step: a new table; the previous release neither reads nor writes it (and has no
platform role).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "platform_views",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("view", sa.String(length=100), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_platform_views_actor", "platform_views", ["actor", "id"], unique=False)
    op.execute(
        """
        CREATE FUNCTION platform_views_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'platform_views is append-only (% refused)', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER platform_views_no_update_delete BEFORE UPDATE OR DELETE "
        "ON platform_views FOR EACH ROW EXECUTE FUNCTION platform_views_append_only()"
    )
    op.execute(
        "CREATE TRIGGER platform_views_no_truncate BEFORE TRUNCATE "
        "ON platform_views FOR EACH STATEMENT EXECUTE FUNCTION platform_views_append_only()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER platform_views_no_truncate ON platform_views")
    op.execute("DROP TRIGGER platform_views_no_update_delete ON platform_views")
    op.execute("DROP FUNCTION platform_views_append_only()")
    op.drop_index("ix_platform_views_actor", table_name="platform_views")
    op.drop_table("platform_views")
