"""A tenant's running jobs, capped across every worker: one tenant cannot hold every slot.

Fairness orders a shared queue's messages by tenant (``tasks.jobs.intake.tenancy``), but
a job that started runs to its end: with nothing more, a tenant whose jobs are long could
fill every worker's slots and make everyone else wait for them. So each tenant's running
jobs hold slots of one line per tenant, taken before the claim exactly as a key's
``queue`` strategy takes them (``tasks.jobs.run.key_limits.take_slot``): leased on Redis's
clock and renewed while they run (a dead worker's slots free themselves within
``KEEL_LOCK_DURATION_S``), a job over its tenant's cap parked without using an attempt and
published as soon as a slot of its tenant frees, in the order it came.

The cap is ``KEEL_TENANT_QUOTAS``'s ``maxRunning``; unset, half of the slots of the
workers alive now (rounded up), so that another tenant, and the system's own jobs (which
no tenant cap holds), always find slots free. With no worker known yet there is no cap.
"""

from __future__ import annotations

import logging
import math
import time

from tasks.jobs.model.key_limits import KeyConcurrency
from tasks.jobs.run import capacity, limits
from tasks.jobs.run.key_limits import KeyNames, take_slot
from tasks.platform.broker import redis_client
from tasks.platform.quotas import current

log = logging.getLogger(__name__)

TENANT_PREFIX = f"{limits.KEY_PREFIX}:tenant"
SLOTS_TTL_S = 5.0  # how long a process trusts the live workers' slots it read

_slots: dict[str, float] = {"count": 0.0, "read_at": -math.inf}


def names(tenant: str) -> KeyNames:
    """The Redis keys of ``tenant``'s running slots and line (its id's length first, so that
    no two ids share them)."""
    return KeyNames(f"{TENANT_PREFIX}:t{len(tenant)}.{tenant}")


def cap() -> int | None:
    """How many jobs one tenant may run at once now; ``None``: no cap."""
    configured = current().max_running
    if configured is not None:
        return configured
    slots = _live_slots()
    return max(1, math.ceil(slots / 2)) if slots > 0 else None


def _live_slots() -> int:
    now = time.monotonic()
    if now - _slots["read_at"] >= SLOTS_TTL_S:
        try:
            _slots["count"] = capacity.live_slots(redis_client())
        except Exception:  # keep the last figure: a cap read a while ago is still fair
            log.warning("could not read the live workers' slots", exc_info=True)
        _slots["read_at"] = now
    return int(_slots["count"])


def admit(admission: limits.Admission, tenant: str | None, job_id: str) -> None:
    """Take a running slot of ``tenant``'s for ``job_id`` into ``admission``; a system job
    (``tenant`` None) takes none. ``LimitReached``: the job waits in its tenant's line."""
    if tenant is None:
        return
    limit = cap()
    if limit is None:
        return
    spec = KeyConcurrency("tenant", max_running=limit)
    take_slot(admission, names(tenant), spec, job_id, f"tenant {tenant!r}")
