"""jobs.watched: a caller waits on this job's result (``AsyncResult.get()``)

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-11 00:00:00.000000

A worker told Celery's result channel of every job's end (a ``PUBLISH`` a job), heard or
not. A caller about to wait now marks the jobs it waits on, in the statement that reads
them (``tasks.jobs.observe.results.read``), and a success is told on the channel only when
its completion finds the mark (``tasks.jobs.end.finish``). Failures and cancellations are
told as before.

A worker of the previous release ignores the column and tells every end. A caller of the
previous release does not mark: a worker of this release does not tell it of a success, and
it reads the record at its fallback round (every 5 s) instead. Upgrade the processes that
wait on results with or before the workers.

An expand step: a nullable column, no table rewrite, no index.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("watched", sa.Boolean()))


def downgrade() -> None:
    op.drop_column("jobs", "watched")
