"""Statements on ``idempotency_keys``: the records of ``Idempotency-Key`` requests
(``tasks.jobs.intake.idempotency`` says how they are used)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.orm import Session

_CLAIM = text(
    """
    INSERT INTO idempotency_keys (tenant_id, user_id, key, fingerprint, expires_at)
    VALUES (:tenant, :user, :key, :fingerprint, clock_timestamp() + make_interval(secs => :ttl))
    ON CONFLICT (tenant_id, user_id, key) DO UPDATE
        SET fingerprint = EXCLUDED.fingerprint, status = NULL, response = NULL,
            claimed_at = clock_timestamp(), expires_at = EXCLUDED.expires_at
        WHERE idempotency_keys.expires_at < clock_timestamp()
           OR (idempotency_keys.status IS NULL
               AND idempotency_keys.claimed_at < clock_timestamp() - make_interval(secs => :lease))
    RETURNING true
    """
)
_READ = text(
    "SELECT fingerprint, status, response FROM idempotency_keys "
    "WHERE tenant_id = :tenant AND user_id = :user AND key = :key"
)
_COMPLETE = text(
    "UPDATE idempotency_keys SET status = :status, response = CAST(:response AS jsonb) "
    "WHERE tenant_id = :tenant AND user_id = :user AND key = :key"
)
_RELEASE = text(
    "DELETE FROM idempotency_keys "
    "WHERE tenant_id = :tenant AND user_id = :user AND key = :key AND status IS NULL"
)
_PURGE = text(
    "DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY("
    "SELECT ctid FROM idempotency_keys WHERE expires_at < clock_timestamp() LIMIT :limit))"
)


def claim(
    session: Session, who: dict[str, str], key: str, fingerprint: str, ttl_s: int, lease_s: int
) -> bool:
    """Take the key: free, past its expiry, or held by a request silent for ``lease_s``."""
    params = {**who, "key": key, "fingerprint": fingerprint, "ttl": ttl_s, "lease": lease_s}
    return session.execute(_CLAIM, params).first() is not None


def read(session: Session, who: dict[str, str], key: str) -> Row[Any] | None:
    return session.execute(_READ, {**who, "key": key}).first()


def complete(session: Session, who: dict[str, str], key: str, status: int, response: Any) -> None:
    params = {**who, "key": key, "status": status, "response": json.dumps(response)}
    session.execute(_COMPLETE, params)


def release(session: Session, who: dict[str, str], key: str) -> None:
    session.execute(_RELEASE, {**who, "key": key})


def purge_expired(session: Session, limit: int) -> int:
    gone: Any = session.execute(_PURGE, {"limit": limit})
    return int(gone.rowcount or 0)
