"""Per-tenant quotas (``KEEL_TENANT_QUOTAS``, JSON), with defaults sized for one busy tenant.

Every field is optional; a value given replaces its default, e.g.
``{"liveJobs": 500, "minChunkSize": 1000}``. A malformed value stops the web
app and beat at start with a message naming it, rather than being ignored.

- ``liveJobs``: jobs waiting, delayed or active at once, whatever their queue
  (a campaign's chunk jobs count too); refused with 429.
- ``schedulers``: job schedulers a tenant may hold; 429.
- ``campaignRecipients``: recipients in the tenant's unfinished campaigns; 429.
- ``minChunkSize``: the smallest ``chunkSize`` a campaign may ask for (each
  chunk is a job); 400.
- ``maxDelaySeconds``: how far ahead a job may be delayed or scheduled (a
  ``runAt``, a template's ``delay``); 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.config import get_settings
from tasks.jobs.intake.tenancy import TenantLimits


@dataclass(frozen=True)
class Quota:
    """A tenant's limits on schedulers: how many, and the limits of the jobs they fire."""

    schedulers: int
    jobs: TenantLimits


class TenantQuotas(BaseModel):
    """What one tenant may hold at once."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    live_jobs: int = Field(default=10_000, ge=1, alias="liveJobs")
    schedulers: int = Field(default=100, ge=0)
    campaign_recipients: int = Field(default=1_000_000, ge=1, alias="campaignRecipients")
    min_chunk_size: int = Field(default=100, ge=1, alias="minChunkSize")
    max_delay_seconds: int = Field(default=366 * 86_400, ge=1, alias="maxDelaySeconds")

    @property
    def jobs(self) -> TenantLimits:
        return TenantLimits(self.live_jobs, self.max_delay_seconds * 1000)

    @property
    def scheduling(self) -> Quota:
        return Quota(self.schedulers, self.jobs)


@lru_cache(maxsize=4)
def parse(raw: str) -> TenantQuotas:
    """``KEEL_TENANT_QUOTAS`` → quotas; a bad value is a ``ValueError`` naming the variable."""
    if not raw.strip():
        return TenantQuotas()
    try:
        loaded = json.loads(raw)
        if not isinstance(loaded, dict):
            raise ValueError("expected a JSON object")
        return TenantQuotas.model_validate(loaded)
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"KEEL_TENANT_QUOTAS is invalid: {exc}") from None


def current() -> TenantQuotas:
    return parse(get_settings().tenant_quotas)
