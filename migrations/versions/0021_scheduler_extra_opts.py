"""job_schedulers.extra_opts: a scheduler template's options added since the record format

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 00:00:00.000000

The previous release parses a scheduler's ``spec`` with models that refuse keys they do
not know, its template's options included: a template saved with an option it lacks
(``timeout``) would fail every fire of that scheduler on its processes during a rolling
upgrade. Those options are kept here instead, as ``jobs.extra_opts`` keeps a job's
(0019), and merged back by this release when it reads the scheduler.

An expand step: a nullable column, no table rewrite, no index.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_schedulers", sa.Column("extra_opts", postgresql.JSONB()))


def downgrade() -> None:
    op.drop_column("job_schedulers", "extra_opts")
