"""Deduplication claims, BullMQ's three modes, kept in Postgres.

The claim is taken in the same transaction that inserts the job, so there
is no moment where an id is claimed but no job exists (a crash rolls both
back) and no window where two concurrent adds both see the id free.

- simple ``{id}``: held until the job completes or fails;
- throttle ``{id, ttl}``: held for ``ttl`` ms, whatever the job does;
- debounce ``{id, ttl, extend, replace}``: a duplicate add extends the ttl
  and/or replaces the held job's data while that job is still delayed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.model.options import Deduplication

_CLAIM_INTO = """
    INSERT INTO dedup_claims (queue, dedup_id, job_id, expires_at)
    SELECT :queue, :dedup_id, :job_id,
           CASE WHEN CAST(:ttl_ms AS bigint) IS NULL THEN NULL
                ELSE clock_timestamp() + make_interval(secs => CAST(:ttl_ms AS float) / 1000)
           END
    {source}
    ON CONFLICT (queue, dedup_id) DO UPDATE
        SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at,
            created_at = clock_timestamp()
        WHERE dedup_claims.expires_at IS NOT NULL
          AND dedup_claims.expires_at <= clock_timestamp()
    RETURNING job_id
"""
_CLAIM = text(_CLAIM_INTO.format(source=""))
# The same claim, first taking an advisory transaction lock (``lock_key``): a tenant's
# quota lock and its dedup claim in one round trip (``tasks.jobs.intake.enqueue``).
_CLAIM_LOCKED = text(
    "WITH locked AS (SELECT pg_advisory_xact_lock(hashtextextended(:lock_key, 0)))"
    + _CLAIM_INTO.format(source="FROM locked")
)


@dataclass(frozen=True)
class Held:
    """The claim is someone else's: ``job_id`` keeps it."""

    job_id: str


def claim(
    session: Session, queue: str, dedup: Deduplication, job_id: str, lock_key: str | None = None
) -> Held | None:
    """Take ``dedup.id`` for ``job_id``; ``Held`` with the live holder if it is taken.

    ``lock_key``: take that advisory transaction lock first, in the same statement.
    """
    params = {"queue": queue, "dedup_id": dedup.id, "job_id": job_id, "ttl_ms": dedup.ttl}
    if lock_key is None:
        ours = session.execute(_CLAIM, params).first()
    else:
        ours = session.execute(_CLAIM_LOCKED, {**params, "lock_key": lock_key}).first()
    if ours is not None:
        return None
    holder = holder_of(session, queue, dedup.id, lock=True)
    if holder is None:  # lapsed between the two statements: try once more
        return claim(session, queue, dedup, job_id)
    return Held(holder)


def holder_of(session: Session, queue: str, dedup_id: str, *, lock: bool = False) -> str | None:
    """BullMQ's ``getDeduplicationJobId``: the job holding ``dedup_id``, if the claim is live."""
    row = session.execute(
        text(
            "SELECT job_id FROM dedup_claims WHERE queue = :queue AND dedup_id = :dedup_id "
            "AND (expires_at IS NULL OR expires_at > clock_timestamp())"
            + (" FOR UPDATE" if lock else "")
        ),
        {"queue": queue, "dedup_id": dedup_id},
    ).first()
    return row[0] if row else None


def extend(session: Session, queue: str, dedup: Deduplication) -> None:
    """Debounce: a duplicate add restarts the claim's ttl."""
    session.execute(
        text(
            "UPDATE dedup_claims SET expires_at = clock_timestamp() "
            "+ make_interval(secs => CAST(:ttl_ms AS float) / 1000) "
            "WHERE queue = :queue AND dedup_id = :dedup_id"
        ),
        {"queue": queue, "dedup_id": dedup.id, "ttl_ms": dedup.ttl},
    )


def hand_over(session: Session, queue: str, dedup: Deduplication, job_id: str) -> None:
    """Debounce with replace: the claim now belongs to the replacing job."""
    session.execute(
        text(
            "UPDATE dedup_claims SET job_id = :job_id, expires_at = CASE "
            "WHEN CAST(:ttl_ms AS bigint) IS NULL THEN NULL ELSE clock_timestamp() "
            "+ make_interval(secs => CAST(:ttl_ms AS float) / 1000) END "
            "WHERE queue = :queue AND dedup_id = :dedup_id"
        ),
        {"queue": queue, "dedup_id": dedup.id, "job_id": job_id, "ttl_ms": dedup.ttl},
    )


def release(session: Session, job_id: str) -> None:
    """A finished job frees its simple-mode claims; ttl claims lapse on their own."""
    session.execute(
        text("DELETE FROM dedup_claims WHERE job_id = :job_id AND expires_at IS NULL"),
        {"job_id": job_id},
    )
