"""The settings that are JSON documents, as typed models: ``KEEL_QUEUE_LIMITS`` and
``KEEL_TENANT_QUOTAS``.

``tasks.platform.config.Settings`` parses both when it is built, so a malformed value
stops every process at start with a message naming the variable, instead of
failing whichever code first reads it. This module imports nothing of Keel:
the settings, the job layer and the web app all read these types.

**Tenant quotas** (``KEEL_TENANT_QUOTAS``), with defaults sized for one busy tenant.

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
- ``maxRunning``, ``maxRunningPerQueue``, ``systemReserve``: running jobs, of a
  tenant and of all tenants together; a job past them waits
  (``tasks.jobs.run.tenant_caps``).

**Queue limits** (``KEEL_QUEUE_LIMITS``): per queue, a global ``concurrency``
and/or a start ``rate`` (``{"max": n, "duration_ms": ms}``), e.g.
``{"reports": {"concurrency": 4, "rate": {"max": 10, "duration_ms": 1000}}}``
(``tasks.jobs.run.limits`` enforces them).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Rate(BaseModel):
    """At most ``max`` job starts in any window of ``duration_ms``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max: int = Field(ge=1)
    duration_ms: int = Field(ge=1)


class QueueLimit(BaseModel):
    """One queue's limits; either may be absent (unlimited)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    concurrency: int | None = Field(default=None, ge=1)
    rate: Rate | None = None


@lru_cache(maxsize=4)
def parse_queue_limits(raw: str) -> dict[str, QueueLimit]:
    """``KEEL_QUEUE_LIMITS`` → limits per queue; a bad value is a ``ValueError`` naming it."""
    if not raw.strip():
        return {}
    try:
        loaded = json.loads(raw)
        if not isinstance(loaded, dict):
            raise ValueError("expected an object keyed by queue name")
        return {queue: QueueLimit.model_validate(limit) for queue, limit in loaded.items()}
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"KEEL_QUEUE_LIMITS is invalid: {exc}") from None


@dataclass(frozen=True)
class TenantLimits:
    """What one tenant may have: live jobs at once, and how far ahead a job may be delayed."""

    live_jobs: int
    max_delay_ms: int


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
    # Jobs of one tenant running at once, across every worker; unset: half the live workers'
    # slots less the system's reserve (rounded up), so that one tenant's burst never holds
    # every slot.
    max_running: int | None = Field(default=None, ge=1, le=10_000, alias="maxRunning")
    # The same on one queue; unset: none (the overall cap only).
    max_running_per_queue: int | None = Field(
        default=None, ge=1, le=10_000, alias="maxRunningPerQueue"
    )
    # Slots of the live workers' that no tenant's job takes, so that the system's jobs always
    # find one; 0 (the default): none reserved, and the tenants' jobs together are not capped.
    system_reserve: int = Field(default=0, ge=0, le=10_000, alias="systemReserve")

    @property
    def jobs(self) -> TenantLimits:
        return TenantLimits(self.live_jobs, self.max_delay_seconds * 1000)

    @property
    def scheduling(self) -> Quota:
        return Quota(self.schedulers, self.jobs)


@lru_cache(maxsize=4)
def parse_tenant_quotas(raw: str) -> TenantQuotas:
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


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> tuple[Network, ...]:
    """Networks separated by commas or spaces (``KEEL_WEBHOOK_ALLOW``: ``10.0.0.0/8``)."""
    found = []
    for word in text.replace(",", " ").split():
        try:
            found.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            raise ValueError(f"{word!r} is not a network (e.g. 10.0.0.0/8)") from None
    return tuple(found)
