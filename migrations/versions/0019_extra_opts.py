"""jobs.extra_opts: the options added since the record format, apart from jobs.opts

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 00:00:00.000000

A worker of the previous release parses ``jobs.opts`` with a model that refuses keys it
does not know. Options this release added (``maxRetries``, ``timeout``) are therefore kept
in this column (``tasks.jobs.model.options.JobOptions.columns``), which that release
neither writes nor reads: during a rolling upgrade its workers run this release's jobs
without them, instead of failing them. A release reads the column leniently (a key it
does not know is left out), so the next releases can add options the same way.

An expand step: a nullable column, no table rewrite, no index.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("extra_opts", postgresql.JSONB()))


def downgrade() -> None:
    # Not merged back into jobs.opts: the previous release would refuse them there. A job
    # then runs with its task's own retries; its time limit is in its Celery context too.
    op.drop_column("jobs", "extra_opts")
