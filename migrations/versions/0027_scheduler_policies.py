"""job_schedulers.policy: a scheduler's overlap, catch-up, jitter and paused state

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 00:00:00.000000

The policies (``tasks.jobs.model.schedule_rules.Policy``) are kept beside the scheduler's
``spec``, not in it: the previous release parses ``spec`` with models that refuse keys they
do not know, and would park every scheduler given a policy during a rolling upgrade. Its
processes ignore this column and fire such a scheduler as before (overlap allowed); a
paused scheduler has no next fire (``next_run_at`` null), so they do not fire it either.

An expand step: a nullable column, no table rewrite, no index.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_schedulers", sa.Column("policy", postgresql.JSONB()))


def downgrade() -> None:
    op.drop_column("job_schedulers", "policy")
