"""ix_jobs_data: search jobs by fields of their data (jsonb containment)

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 00:00:00.000000

``GET /api/v1/jobs?data.customerId=42`` (and ``keel jobs list --data``, the dashboard's
search box) asks ``data @> '{"customerId": 42}'``. A GIN index with the ``jsonb_path_ops``
operator class answers containment from a hash of each path-and-value, so a search reads
the matching records only, whatever the tenant's history holds; the listing's tenant and
order come from the rows it found (a search's matches are few), see ``store/listing.py``.

An expand step (on a large table, build it first with ``CREATE INDEX CONCURRENTLY`` under
the same name and definition: the step skips an existing one). A worker of the previous
release neither needs nor minds it; its writes keep it current.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_data",
        "jobs",
        ["data"],
        unique=False,
        postgresql_using="gin",
        postgresql_ops={"data": "jsonb_path_ops"},
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_data", table_name="jobs")
