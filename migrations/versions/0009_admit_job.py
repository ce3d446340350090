"""keel_admit_job: a tenant's quota lock, a dedup claim and the load count in one call

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 03:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "('waiting', 'active', 'delayed', 'waiting-children')"

# What an add with a dedup rule or a tenant's quota decides before its insert, so that
# the add is one statement (``tasks.jobs.store.admission``): each query here takes its
# own snapshot (a volatile function, READ COMMITTED), so the count runs after the quota
# lock is held and sees every add that committed before it, as two statements would.
# Over the quota it raises SQLSTATE KQ001 (the live count in DETAIL): the statement,
# its dedup claim with it, is rolled back.
ADMIT = f"""
CREATE FUNCTION keel_admit_job(
    p_lock_key text, p_tenant_id text, p_queue text, p_dedup_id text, p_dedup_ttl_ms bigint,
    p_job_id text, p_max_live bigint, p_up_to bigint)
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
    IF p_max_live IS NULL THEN
        -- no quota: only the party's load on the queue (the priority), counted up to p_up_to
        IF p_tenant_id IS NULL THEN
            SELECT count(*) INTO on_queue FROM (
                SELECT 1 FROM jobs j WHERE j.tenant_id IS NULL AND j.queue = p_queue
                  AND j.state IN ('waiting', 'active') LIMIT p_up_to) AS ahead;
        ELSE
            SELECT count(*) INTO on_queue FROM (
                SELECT 1 FROM jobs j WHERE j.tenant_id = p_tenant_id AND j.queue = p_queue
                  AND j.state IN ('waiting', 'active') LIMIT p_up_to) AS ahead;
        END IF;
    ELSE
        SELECT count(*),
               count(*) FILTER (WHERE j.queue = p_queue AND j.state IN ('waiting', 'active'))
        INTO live, on_queue
        FROM jobs j WHERE j.tenant_id = p_tenant_id AND j.state IN {LIVE};
        IF live >= p_max_live THEN
            RAISE EXCEPTION 'the tenant has % live jobs, its quota is %', live, p_max_live
                USING ERRCODE = 'KQ001', DETAIL = live::text;
        END IF;
    END IF;
    kept := NULL;
    RETURN NEXT;
END $$
"""


def upgrade() -> None:
    op.execute(ADMIT)


def downgrade() -> None:
    op.execute("DROP FUNCTION keel_admit_job(text, text, text, text, bigint, text, bigint, bigint)")
