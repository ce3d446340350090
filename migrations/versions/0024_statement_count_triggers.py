"""jobs_count_added/removed: count deltas once per statement for inserts and deletes

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05 00:00:00.000000

``jobs_count_states`` ran once per row: a bulk add of 10,000 jobs ran it 10,000 times, each
an insert of one delta row, a fifth of Postgres's work for the add. Inserts and deletes now
count through statement triggers over the statement's transition table (one grouped
insert per statement: a bulk add writes one delta row per queue, tenant and state); a
state or queue change stays a row trigger, since a trigger naming its columns
(``UPDATE OF state, queue``) cannot have a transition table. Counts read the same
(``tasks.jobs.store.counts`` sums ``n``). A single-row insert costs Postgres a few
microseconds more than before.

A worker of the previous release neither sees nor minds the change; its adds and trims are
counted the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _counting(name: str, table: str, sign: str) -> str:
    return f"""
        CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO job_count_deltas (queue, tenant_id, state, n)
            SELECT queue, COALESCE(tenant_id, ''), state, {sign}count(*)
            FROM {table} GROUP BY queue, COALESCE(tenant_id, ''), state;
            RETURN NULL;
        END $$
    """


def upgrade() -> None:
    op.execute(_counting("jobs_count_added", "added", ""))
    op.execute(_counting("jobs_count_removed", "removed", "-"))
    op.execute("DROP TRIGGER jobs_count_states ON jobs")
    op.execute(
        "CREATE TRIGGER jobs_count_states AFTER UPDATE OF state, queue ON jobs "
        "FOR EACH ROW EXECUTE FUNCTION jobs_count_states()"
    )
    op.execute(
        "CREATE TRIGGER jobs_count_added AFTER INSERT ON jobs REFERENCING NEW TABLE AS added "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_added()"
    )
    op.execute(
        "CREATE TRIGGER jobs_count_removed AFTER DELETE ON jobs "
        "REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_removed()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_count_added ON jobs")
    op.execute("DROP TRIGGER jobs_count_removed ON jobs")
    op.execute("DROP TRIGGER jobs_count_states ON jobs")
    op.execute(
        "CREATE TRIGGER jobs_count_states AFTER INSERT OR DELETE OR UPDATE OF state, queue "
        "ON jobs FOR EACH ROW EXECUTE FUNCTION jobs_count_states()"
    )
    op.execute("DROP FUNCTION jobs_count_added()")
    op.execute("DROP FUNCTION jobs_count_removed()")
