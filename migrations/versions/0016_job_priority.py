"""jobs.priority: a call's ``priority=``, ranked within its party's share of a queue

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 17:10:00.000000

A job's ``priority`` is its rank among its own party's jobs on its queue, 0 first
(``tasks.jobs.intake.tenancy.rank``). What places a job among the broker's priority lists
is the number of its party's jobs running or waiting on the queue that rank at or before
it: the index holds exactly those, so the count stops after a few entries however many
lower-ranked jobs wait. ``keel_admit_job`` gains the rank (a new overload: the previous
release keeps calling the old one until the contract step drops it).

An expand step: a column with a default (no table rewrite), an index and a function; the
previous release's inserts get rank 0. On Redis that is what a call without a priority
ranks; on RabbitMQ (where it ranks 9) records from before the upgrade count as urgent among
their tenant's jobs until they end. On a large table, build the index by hand first with
``CREATE INDEX CONCURRENTLY`` under the same name (the step skips an existing one).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "('waiting', 'active', 'delayed', 'waiting-children')"
AHEAD = "state IN ('waiting', 'active')"

# As 0009's keel_admit_job, the queue load counting only the party's jobs that rank at or
# before this one.
ADMIT = f"""
CREATE FUNCTION keel_admit_job(
    p_lock_key text, p_tenant_id text, p_queue text, p_dedup_id text, p_dedup_ttl_ms bigint,
    p_job_id text, p_max_live bigint, p_up_to bigint, p_priority smallint)
RETURNS TABLE (kept text, live bigint, on_queue bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    claimed text;
BEGIN
    IF p_lock_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_lock_key, 0));
    END IF;
    IF p_dedup_id IS NOT NULL THEN
        LOOP
            INSERT INTO dedup_claims AS c (queue, dedup_id, job_id, expires_at)
            VALUES (p_queue, p_dedup_id, p_job_id,
                    CASE WHEN p_dedup_ttl_ms IS NULL THEN NULL
                         ELSE clock_timestamp()
                              + make_interval(secs => p_dedup_ttl_ms::float / 1000) END)
            ON CONFLICT (queue, dedup_id) DO UPDATE
                SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at,
                    created_at = clock_timestamp()
                WHERE c.expires_at IS NOT NULL AND c.expires_at <= clock_timestamp()
            RETURNING c.job_id INTO claimed;
            EXIT WHEN claimed IS NOT NULL;
            SELECT c.job_id INTO kept FROM dedup_claims c
            WHERE c.queue = p_queue AND c.dedup_id = p_dedup_id
              AND (c.expires_at IS NULL OR c.expires_at > clock_timestamp())
            FOR UPDATE;
            IF kept IS NOT NULL THEN
                RETURN NEXT;  -- a live job holds the id: it absorbs this add
                RETURN;
            END IF;
            -- the holder's claim lapsed between the two statements: claim again
        END LOOP;
    END IF;
    IF p_max_live IS NOT NULL THEN
        SELECT count(*) INTO live
        FROM jobs j WHERE j.tenant_id = p_tenant_id AND j.state IN {LIVE};
        IF live >= p_max_live THEN
            RAISE EXCEPTION 'the tenant has % live jobs, its quota is %', live, p_max_live
                USING ERRCODE = 'KQ001', DETAIL = live::text;
        END IF;
    END IF;
    -- the party's jobs ahead of this one on the queue (its broker priority), up to p_up_to
    IF p_tenant_id IS NULL THEN
        SELECT count(*) INTO on_queue FROM (
            SELECT 1 FROM jobs j WHERE j.tenant_id IS NULL AND j.queue = p_queue
              AND j.state IN ('waiting', 'active') AND j.priority <= p_priority
            LIMIT p_up_to) AS ahead;
    ELSE
        SELECT count(*) INTO on_queue FROM (
            SELECT 1 FROM jobs j WHERE j.tenant_id = p_tenant_id AND j.queue = p_queue
              AND j.state IN ('waiting', 'active') AND j.priority <= p_priority
            LIMIT p_up_to) AS ahead;
    END IF;
    kept := NULL;
    RETURN NEXT;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False)
    )
    op.create_index(
        "ix_jobs_party_ahead",
        "jobs",
        ["tenant_id", "queue", "priority"],
        unique=False,
        postgresql_where=sa.text(AHEAD),
        if_not_exists=True,
    )
    op.execute(ADMIT)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION keel_admit_job(text, text, text, text, bigint, text, bigint, bigint, "
        "smallint)"
    )
    op.drop_index("ix_jobs_party_ahead", table_name="jobs", postgresql_where=sa.text(AHEAD))
    op.drop_column("jobs", "priority")
