"""Each user's and each tenant's share of the open event streams, counted in Redis.

A stream holds a server thread for up to five minutes, and a process has
only so many for streams (``web.serving``): without shares, one user's 200
tabs or script took every slot and other tenants got 503. So a stream also
needs a *lease* under its user's cap and its tenant's cap:

- ``KEEL_STREAMS_PER_USER`` (default 16) open streams per user of a tenant;
- ``KEEL_STREAMS_PER_TENANT`` (default 64) per tenant, all its users together;
- ``off`` (or ``0``) turns a cap off. Read from the app's config, else the
  environment.

Past a cap the stream is refused with 503, ``Retry-After`` and the cap in
``details`` (``streamsPerUser`` / ``streamsPerTenant``); the slots left stay
free for everyone else.

The counts are shared by every API process and host: a lease is a member of a
Redis sorted set per user and per tenant, scored by when it expires (Redis's
clock). An open stream renews its lease every ``RENEW_S``; closing the stream
removes it. A process that dies without closing leaves leases that lapse
within ``LEASE_S``, so a crash never holds a share for long. One Lua script
reads and counts both sets, so two requests racing for the last lease cannot
both get it.

Like the request rate limit, the shares fail open: with Redis unreachable a
stream is let through (its process's own slots still bound it) and the
problem is logged, rather than every stream being refused while Redis blips.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from flask import current_app

from tasks.platform import broker
from tasks.platform.config import get_settings
from web.errors import RETRY_AFTER_S, ApiError

log = logging.getLogger(__name__)

KEY_PREFIX = "keel:streams"
LEASE_S = 30.0  # a lease not renewed for this long has lapsed (its process died)
RENEW_S = 10.0
DEFAULT_PER_USER = 16
DEFAULT_PER_TENANT = 64
CAPS = (
    ("KEEL_STREAMS_PER_USER", "streamsPerUser", DEFAULT_PER_USER),
    ("KEEL_STREAMS_PER_TENANT", "streamsPerTenant", DEFAULT_PER_TENANT),
)

# KEYS: one sorted set per cap; ARGV: lease seconds, lease id, then each cap.
# Refused by a cap: its index; else the lease is in every set: 0.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    if redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[2 + i]) then
        return i
    end
end
for i = 1, #KEYS do
    redis.call('ZADD', KEYS[i], now + ttl, ARGV[2])
    redis.call('EXPIRE', KEYS[i], math.ceil(ttl) + 1)
end
return 0
"""
# KEYS: the lease's sets; ARGV: lease seconds, lease id. Pushes the lease's expiry on.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS do
    redis.call('ZADD', KEYS[i], 'XX', now + ttl, ARGV[2])
    redis.call('EXPIRE', KEYS[i], math.ceil(ttl) + 1)
end
return 0
"""


def _cap(config_name: str, default: int) -> int | None:
    """A cap from the app's config, else the settings (``tasks.platform.config``, checked when the
    process starts); ``None`` when it is off."""
    raw = current_app.config.get(config_name)
    if raw is None:
        attr = config_name.removeprefix("KEEL_").lower()
        raw = getattr(get_settings(), attr, None)
    if raw is None or str(raw).strip() == "":
        return default
    text = str(raw).strip().lower()
    if text in ("off", "none", "0"):
        return None
    if not text.isascii() or not text.isdigit():
        raise RuntimeError(f"{config_name}={raw!r} is not a number of streams (or 'off')")
    return int(text)


@dataclass
class StreamLease:
    """One open stream's place in its user's and tenant's share (renewed while it is open)."""

    keys: list[str]
    lease_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    renewed_at: float = field(default_factory=time.monotonic)
    _released: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def renew(self) -> None:
        """Called from the stream's loop: at most every ``RENEW_S``, push the expiry on."""
        if time.monotonic() - self.renewed_at < RENEW_S or broker.unreachable():
            return
        self.renewed_at = time.monotonic()
        _call(_RENEW, self.keys, [LEASE_S, self.lease_id])

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        if broker.unreachable():
            return  # it lapses within LEASE_S
        started = time.monotonic()
        try:
            client = broker.redis_client()
            with client.pipeline(transaction=False) as pipe:
                for key in self.keys:
                    pipe.zrem(key, self.lease_id)
                pipe.execute()
        except broker.UNREACHABLE_ERRORS as exc:
            broker.failed(exc, started)


_SCRIPTS: dict[tuple[int, str], Any] = {}


def _call(script: str, keys: list[str], args: list[Any]) -> Any:
    """Run ``script``; ``None`` if Redis did not answer (noted for the process)."""
    started = time.monotonic()
    try:
        client = broker.redis_client()
        registered = _SCRIPTS.get((id(client), script))
        if registered is None:
            registered = _SCRIPTS[(id(client), script)] = client.register_script(script)
        return registered(keys=keys, args=args)
    except broker.UNREACHABLE_ERRORS as exc:
        broker.failed(exc, started)
        log.warning("stream shares unavailable, letting the stream through: %s", exc)
        return None


def take(tenant_id: str, user_id: str) -> StreamLease | None:
    """A lease for one more stream of ``user_id`` of ``tenant_id``, or 503 naming the cap.

    ``None`` when no cap is on, or Redis does not answer (fail open).
    """
    user_cap = _cap(CAPS[0][0], CAPS[0][2])
    tenant_cap = _cap(CAPS[1][0], CAPS[1][2])
    held: list[tuple[str, int, str]] = []
    if user_cap is not None:
        held.append((f"{KEY_PREFIX}:user:{tenant_id}:{user_id}", user_cap, CAPS[0][1]))
    if tenant_cap is not None:
        held.append((f"{KEY_PREFIX}:tenant:{tenant_id}", tenant_cap, CAPS[1][1]))
    if not held or broker.unreachable():
        return None
    lease = StreamLease([key for key, _, _ in held])
    refused = _call(_TAKE, lease.keys, [LEASE_S, lease.lease_id, *(cap for _, cap, _ in held)])
    if refused is None:
        return None
    if int(refused):
        _, cap, name = held[int(refused) - 1]
        whose = "user" if name == "streamsPerUser" else "tenant"
        raise ApiError(
            503,
            f"this {whose} already has {cap} open event streams ({name}); "
            "close one or try again shortly",
            details=[{"limit": name, "max": cap, "retryAfterSeconds": RETRY_AFTER_S}],
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return lease
