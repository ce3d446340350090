"""The records of ``Idempotency-Key`` requests (``web.idempotency`` speaks HTTP over them).

One row per user of a tenant and key (``tasks.jobs.store.idempotency``): the first request
claims it (``claim``: an insert that a
concurrent one finds taken), runs, and stores its answer (``complete``) or gives the key
back if it failed (``release``), so that sending it again runs it again. A row whose
request never finished (its server died) can be claimed again after ``LEASE_S``; a row
past its ``expires_at`` is claimed afresh, and the retention round deletes such rows
(``purge_expired``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.jobs.store import idempotency as store
from tasks.platform.db import transaction

# A first request that has not answered within this long is taken to be gone.
LEASE_S = 60


@dataclass(frozen=True)
class Who:
    """Whose keys: a user's of a tenant (another user's same key is another key)."""

    tenant_id: str
    user_id: str

    @property
    def params(self) -> dict[str, str]:
        return {"tenant": self.tenant_id, "user": self.user_id}


@dataclass(frozen=True)
class Found:
    """What the key holds: claimed by this request, or another request's (its fingerprint,
    and its answer once it has one)."""

    claimed: bool
    fingerprint: str | None = None
    status: int | None = None
    response: Any = None


def claim(who: Who, key: str, fingerprint: str, ttl_s: int) -> Found:
    """Claim ``key`` for this request, or say whose it is (``Found.claimed`` False; a key
    just given back reads as nobody's: ``fingerprint`` None)."""
    with transaction(one_statement=True) as session:
        taken = store.claim(session, who.params, key, fingerprint, ttl_s, LEASE_S)
    return Found(claimed=True) if taken else read(who, key)


def read(who: Who, key: str) -> Found:
    with transaction(one_statement=True) as session:
        row = store.read(session, who.params, key)
    if row is None:
        return Found(claimed=False)
    return Found(False, row.fingerprint, row.status, row.response)


def complete(who: Who, key: str, status: int, response: Any) -> None:
    """The claimed request answered ``status`` with ``response``: kept for its replays."""
    with transaction(one_statement=True) as session:
        store.complete(session, who.params, key, status, response)


def release(who: Who, key: str) -> None:
    """The claimed request failed: the key is nobody's again."""
    with transaction(one_statement=True) as session:
        store.release(session, who.params, key)


def purge_expired(limit: int = 10_000) -> int:
    """Delete up to ``limit`` keys past their ``expires_at``; how many."""
    with transaction(one_statement=True) as session:
        return store.purge_expired(session, limit)
