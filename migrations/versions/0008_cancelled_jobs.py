"""cancelled jobs, and indexes for listing jobs newest first

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_STATES = "state IN ('waiting','active','delayed','completed','failed','waiting-children')"
NEW_STATES = (
    "state IN ('waiting','active','delayed','completed','failed','waiting-children','cancelled')"
)
OLD_FINISHED = "state IN ('completed','failed')"
NEW_FINISHED = "state IN ('completed','failed','cancelled')"


def _finished_index(where: str) -> None:
    op.create_index(
        "ix_jobs_finished",
        "jobs",
        ["queue", "tenant_id", "state", "finished_on"],
        unique=False,
        postgresql_where=sa.text(where),
    )


def upgrade() -> None:
    # A job cancelled (or revoked through Celery) before it ran: final, never claimed.
    op.drop_constraint(op.f("ck_jobs_state"), "jobs", type_="check")
    op.create_check_constraint(op.f("ck_jobs_state"), "jobs", NEW_STATES)
    # Retention trims cancelled records like finished ones.
    op.drop_index("ix_jobs_finished", table_name="jobs", postgresql_where=sa.text(OLD_FINISHED))
    _finished_index(NEW_FINISHED)
    # Listing jobs newest first, a page after a (created_at, id) key: a user's own
    # jobs (the owner index, extended) and a tenant's (operators).
    op.drop_index("ix_jobs_owner", table_name="jobs")
    op.create_index(
        "ix_jobs_owner", "jobs", ["tenant_id", "user_id", "created_at", "id"], unique=False
    )
    op.create_index(
        "ix_jobs_tenant_created", "jobs", ["tenant_id", "created_at", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_created", table_name="jobs")
    op.drop_index("ix_jobs_owner", table_name="jobs")
    op.create_index("ix_jobs_owner", "jobs", ["tenant_id", "user_id"], unique=False)
    op.drop_index("ix_jobs_finished", table_name="jobs", postgresql_where=sa.text(NEW_FINISHED))
    _finished_index(OLD_FINISHED)
    # The older schema has no cancelled state: those records stay, as failed ones.
    op.execute(
        "UPDATE jobs SET state = 'failed', failed_reason = COALESCE(failed_reason, 'cancelled') "
        "WHERE state = 'cancelled'"
    )
    op.drop_constraint(op.f("ck_jobs_state"), "jobs", type_="check")
    op.create_check_constraint(op.f("ck_jobs_state"), "jobs", OLD_STATES)
