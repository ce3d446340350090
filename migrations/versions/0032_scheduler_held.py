"""job_schedulers.held_since: when a scheduler's due slot began to wait under overlap buffer

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-09 00:00:00.000000

A slot held by ``overlap: buffer`` (its scheduler's last job still live) stays due, and was
always among the oldest due rows: enough of them filled every beat round's window and no
other scheduler fired. Beat now fires the due schedulers whose slot is not held first, and
looks at the held ones apart, with what is left of the round
(``tasks.jobs.schedule.firing.fire_due``). This column says which are held, and since when.

A beat of the previous release ignores the column and orders due rows as before; upgrade
every beat. A held slot it fires keeps a stale ``held_since``, which only sends the row to
the held ones' check once more (it fires there as it would have).

An expand step: a nullable column, no table rewrite, no index.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_schedulers", sa.Column("held_since", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("job_schedulers", "held_since")
