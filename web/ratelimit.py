"""A per-tenant request rate limit, shared by every API process through Redis.

One tenant's flood must not starve another, so the budget is per tenant (taken
from the verified token, never from the request) and every API replica counts
against the same Redis moving window. Past the limit a request is answered 429
with ``Retry-After``.

``KEEL_TENANT_RATE_LIMIT`` (env, or app config in tests) sets the limit in the
``limits`` notation, e.g. ``600/minute``; ``off`` disables it. The default is
generous: the limit is a guard against floods, not a quota. Within a tenant,
one user may take only a share of it (``KEEL_USER_RATE_LIMIT``, half of the
tenant's by default), so one user's runaway script leaves room for the others.

Both windows are read and counted by one Redis script, in one round trip: a
request refused by either limit is counted in neither, and the windows are
moving windows (the Nth most recent request within the period refuses the next),
timed by Redis's clock, so every API host agrees.

The limiter fails open: if Redis cannot be reached the request goes through and
the problem is logged (at most once per back-off period), because refusing all
traffic whenever Redis blips would turn a cache outage into an API outage. When
the limiter uses the stack's own Redis, a hung Redis it meets is also noted for
the rest of the process (``tasks.platform.broker``), so the same request does not wait
for it again to emit its events or publish its job.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, current_app
from limits import RateLimitItem, parse

from tasks.platform import broker
from tasks.platform.config import get_settings
from web.errors import ApiError

log = logging.getLogger(__name__)

EXTENSION = "keel_ratelimit"
KEY_PREFIX = "keel:ratelimit"
# After Redis fails, skip the limiter this long, so a dead Redis does not add a
# connection attempt (and a log line) to every request.
BACKOFF_S = 5.0
# A Redis that does not answer quickly is treated as down: the API must not hang on it.
REDIS_TIMEOUT_S = 0.5


# KEYS: one list of request times per window; ARGV: each window's limit and seconds.
# Refused by a window: {its index, seconds until it has room}; else every window counts
# the request: {0, "0"}.
_HIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i = 1, #KEYS do
    local limit, window = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
    local oldest = redis.call('LINDEX', KEYS[i], limit - 1)
    if oldest and tonumber(oldest) > now - window then
        return {i, tostring(tonumber(oldest) + window - now)}
    end
end
for i = 1, #KEYS do
    local limit, window = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
    redis.call('LPUSH', KEYS[i], string.format('%.6f', now))
    redis.call('LTRIM', KEYS[i], 0, limit - 1)
    redis.call('EXPIRE', KEYS[i], math.ceil(window))
end
return {0, '0'}
"""


@dataclass
class TenantRateLimiter:
    """Moving-window limits per tenant and per user in Redis, failing open when Redis is down."""

    item: RateLimitItem | None
    storage_url: str | None = None  # None: the stack's Redis (KEEL_REDIS_URL), read on first use
    user_item: RateLimitItem | None = None
    _script: Any = None
    _down_until: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _hit(self) -> Any:
        """The windows script, registered on this limiter's Redis client."""
        with self._lock:
            if self._script is None:
                client = broker.new_client(
                    self.storage_url,
                    socket_connect_timeout=REDIS_TIMEOUT_S,
                    socket_timeout=REDIS_TIMEOUT_S,
                )
                self._script = client.register_script(_HIT)
            return self._script

    def check(self, tenant_id: str, user_id: str | None = None) -> None:
        """Count one request for the user, then its tenant; raise 429 past either limit.

        The user's share is checked first, so requests refused for it do not
        spend the budget the tenant's other users share.
        """
        # the stack's Redis, which tasks.platform.broker watches too
        shared = self.storage_url is None
        if self.item is None or time.monotonic() < self._down_until:
            return
        if shared and broker.unreachable():
            return
        checks: list[tuple[str, RateLimitItem, str]] = [
            ("tenant", self.item, _key("tenant", self.item, tenant_id))
        ]
        if self.user_item is not None and user_id is not None:
            checks.insert(
                0, ("user", self.user_item, _key("user", self.user_item, tenant_id, user_id))
            )
        windows: list[Any] = []
        for _, item, _key_name in checks:
            windows += [item.amount, item.get_expiry()]
        started = time.monotonic()
        try:
            refused, wait_s = self._hit()(keys=[key for _, _, key in checks], args=windows)
        except Exception as exc:  # any storage failure: fail open, never 500
            if shared:
                broker.failed(exc, started)
            self._down_until = time.monotonic() + BACKOFF_S
            log.warning("request rate limit unavailable, letting requests through: %s", exc)
            return
        if int(refused):
            who, item, _ = checks[int(refused) - 1]
            raise self._refusal(who, item, float(wait_s))

    @staticmethod
    def _refusal(who: str, item: RateLimitItem, wait_s: float) -> ApiError:
        retry_after = max(1, math.ceil(wait_s))
        return ApiError(
            429,
            f"{who} request rate limit exceeded ({item}); retry after {retry_after}s",
            details=[
                {"limit": f"{who}RequestRate", "rate": str(item), "retryAfterSeconds": retry_after}
            ],
            headers={"Retry-After": str(retry_after)},
        )


def _key(who: str, item: RateLimitItem, *names: str) -> str:
    """One window's list of request times: whose, which rate (a changed limit starts afresh)."""
    return ":".join((KEY_PREFIX, who, f"{item.amount}-{item.get_expiry()}", *names))


def _parse(limit: str, name: str = "KEEL_TENANT_RATE_LIMIT") -> RateLimitItem | None:
    if limit.strip().lower() in ("", "off", "none", "0"):
        return None
    try:
        return parse(limit)
    except ValueError:
        raise RuntimeError(f"{name}={limit!r} is not a rate such as '600/minute'") from None


def _user_share(tenant: RateLimitItem | None) -> str:
    """Half of the tenant's limit, over the same window."""
    if tenant is None:
        return "off"
    return f"{max(1, tenant.amount // 2)}/{tenant.multiples} {tenant.GRANULARITY.name}"


def init_app(app: Flask) -> None:
    """Read the limits (test config wins over env) and attach the limiter to ``app``."""
    settings = get_settings()
    app.config.setdefault("KEEL_TENANT_RATE_LIMIT", settings.tenant_rate_limit)
    tenant = _parse(str(app.config["KEEL_TENANT_RATE_LIMIT"]))
    app.config.setdefault("KEEL_USER_RATE_LIMIT", settings.user_rate_limit or _user_share(tenant))
    app.config.setdefault("KEEL_RATELIMIT_STORAGE_URL", None)
    app.extensions[EXTENSION] = TenantRateLimiter(
        tenant,
        app.config["KEEL_RATELIMIT_STORAGE_URL"],
        _parse(str(app.config["KEEL_USER_RATE_LIMIT"]), "KEEL_USER_RATE_LIMIT"),
    )


def check(tenant_id: str, user_id: str | None = None) -> None:
    """Apply the current app's tenant and user limits (apps without them are unlimited)."""
    limiter: TenantRateLimiter | None = current_app.extensions.get(EXTENSION)
    if limiter is not None:
        limiter.check(tenant_id, user_id)
