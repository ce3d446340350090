"""Who a job belongs to: a tenant and a user within it, always taken from a token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    """A job's tenant and user; the API only ever shows a job to its owner (or to an
    operator of its tenant)."""

    tenant_id: str
    user_id: str
