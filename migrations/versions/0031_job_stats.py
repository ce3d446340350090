"""job_stats: a bounded history of each queue's finished runs per tenant

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-08 00:00:00.000000

The counting trigger (``jobs_count_states``, the row trigger on a state change) now writes,
on the ``+1`` row of a change into ``completed`` or ``failed``, when the job finished and
its wait and run times (three more values in the insert it already made: no statement is
added to a job's end). Compaction (``tasks.jobs.store.counts.compact``) folds those rows into
``job_stats`` in the statement that folds them into ``job_counts``, so each end is counted
once, and before retention can delete its record.

A worker of the previous release compacting meanwhile folds the new rows into the counts
only: their ends are missing from the history (never counted twice).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "OLD.queue, COALESCE(OLD.tenant_id, ''), OLD.state"
_NEW = "NEW.queue, COALESCE(NEW.tenant_id, ''), NEW.state"
_COLS = "queue, tenant_id, state"


def _count_trigger(timed: bool) -> str:
    """0007's delta trigger; ``timed``: an end also says when, and its wait and run times."""
    ended = ""
    if timed:
        due = "GREATEST(NEW.created_at, COALESCE(NEW.run_at, NEW.created_at))"
        wait = f"GREATEST(0, EXTRACT(EPOCH FROM NEW.processed_on - {due}) * 1000)::bigint"
        run = "GREATEST(0, EXTRACT(EPOCH FROM NEW.finished_on - NEW.processed_on) * 1000)::bigint"
        ended = f"""
            ELSIF OLD.state IS DISTINCT FROM NEW.state
                  AND NEW.state IN ('completed', 'failed') AND NEW.finished_on IS NOT NULL THEN
                INSERT INTO job_count_deltas ({_COLS}, n, finished_on, wait_ms, run_ms)
                VALUES ({_OLD}, -1, NULL, NULL, NULL),
                       ({_NEW}, 1, NEW.finished_on, {wait}, {run});"""
    return f"""
        CREATE OR REPLACE FUNCTION jobs_count_states() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO job_count_deltas ({_COLS}, n) VALUES ({_NEW}, 1);
            ELSIF TG_OP = 'DELETE' THEN
                INSERT INTO job_count_deltas ({_COLS}, n) VALUES ({_OLD}, -1);{ended}
            ELSIF OLD.state IS DISTINCT FROM NEW.state OR OLD.queue IS DISTINCT FROM NEW.queue THEN
                INSERT INTO job_count_deltas ({_COLS}, n) VALUES ({_OLD}, -1), ({_NEW}, 1);
            END IF;
            RETURN NULL;
        END $$
    """


def upgrade() -> None:
    op.add_column(
        "job_count_deltas", sa.Column("finished_on", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("job_count_deltas", sa.Column("wait_ms", sa.BigInteger(), nullable=True))
    op.add_column("job_count_deltas", sa.Column("run_ms", sa.BigInteger(), nullable=True))
    counter = {"server_default": "0", "nullable": False}
    op.create_table(
        "job_stats",
        sa.Column("tenant_id", sa.String(length=200), nullable=False),
        sa.Column("step_s", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("completed", sa.Integer(), **counter),
        sa.Column("failed", sa.Integer(), **counter),
        sa.Column("timed", sa.Integer(), **counter),
        sa.Column("wait_ms_sum", sa.BigInteger(), **counter),
        sa.Column("wait_ms_max", sa.BigInteger(), **counter),
        sa.Column("run_ms_sum", sa.BigInteger(), **counter),
        sa.Column("run_ms_max", sa.BigInteger(), **counter),
        sa.PrimaryKeyConstraint(
            "tenant_id", "step_s", "bucket", "queue", name=op.f("pk_job_stats")
        ),
    )
    op.create_index("ix_job_stats_expiry", "job_stats", ["step_s", "bucket"], unique=False)
    op.execute(_count_trigger(timed=True))


def downgrade() -> None:
    op.execute(_count_trigger(timed=False))
    op.drop_index("ix_job_stats_expiry", table_name="job_stats")
    op.drop_table("job_stats")
    op.drop_column("job_count_deltas", "run_ms")
    op.drop_column("job_count_deltas", "wait_ms")
    op.drop_column("job_count_deltas", "finished_on")
