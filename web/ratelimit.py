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

The limiter fails open: if Redis cannot be reached the request goes through and
the problem is logged (at most once per back-off period), because refusing all
traffic whenever Redis blips would turn a cache outage into an API outage. When
the limiter uses the stack's own Redis, a hung Redis it meets is also noted for
the rest of the process (``tasks.broker``), so the same request does not wait
for it again to emit its events or publish its job.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field

from flask import Flask, current_app
from limits import RateLimitItem, parse
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from tasks import broker
from tasks.config import get_settings
from web.errors import ApiError

log = logging.getLogger(__name__)

EXTENSION = "keel_ratelimit"
KEY_PREFIX = "keel:ratelimit"
# After Redis fails, skip the limiter this long, so a dead Redis does not add a
# connection attempt (and a log line) to every request.
BACKOFF_S = 5.0
# A Redis that does not answer quickly is treated as down: the API must not hang on it.
REDIS_TIMEOUT_S = 0.5


@dataclass
class TenantRateLimiter:
    """Moving-window limits per tenant and per user in Redis, failing open when Redis is down."""

    item: RateLimitItem | None
    storage_url: str | None = None  # None: the stack's Redis (KEEL_REDIS_URL), read on first use
    user_item: RateLimitItem | None = None
    _limiter: MovingWindowRateLimiter | None = None
    _down_until: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _strategy(self) -> MovingWindowRateLimiter:
        with self._lock:
            if self._limiter is None:
                storage = storage_from_string(
                    self.storage_url or get_settings().redis,
                    key_prefix=KEY_PREFIX,
                    socket_connect_timeout=REDIS_TIMEOUT_S,
                    socket_timeout=REDIS_TIMEOUT_S,
                )
                self._limiter = MovingWindowRateLimiter(storage)
            return self._limiter

    def check(self, tenant_id: str, user_id: str | None = None) -> None:
        """Count one request for the user, then its tenant; raise 429 past either limit.

        The user's share is checked first, so requests refused for it do not
        spend the budget the tenant's other users share.
        """
        shared = self.storage_url is None  # the stack's Redis, which tasks.broker watches too
        if self.item is None or time.monotonic() < self._down_until:
            return
        if shared and broker.unreachable():
            return
        checks: list[tuple[str, RateLimitItem, tuple[str, ...]]] = [
            ("tenant", self.item, (tenant_id,))
        ]
        if self.user_item is not None and user_id is not None:
            checks.insert(0, ("user", self.user_item, (tenant_id, user_id)))
        for who, item, keys in checks:
            started = time.monotonic()
            try:
                limiter = self._strategy()
                if limiter.hit(item, *keys):
                    continue
                reset_at = limiter.get_window_stats(item, *keys).reset_time
            except Exception as exc:  # any storage failure: fail open, never 500
                if shared:
                    broker.failed(exc, started)
                self._down_until = time.monotonic() + BACKOFF_S
                log.warning("request rate limit unavailable, letting requests through: %s", exc)
                return
            raise self._refusal(who, item, reset_at)

    @staticmethod
    def _refusal(who: str, item: RateLimitItem, reset_at: float) -> ApiError:
        retry_after = max(1, math.ceil(reset_at - time.time()))
        return ApiError(
            429,
            f"{who} request rate limit exceeded ({item}); retry after {retry_after}s",
            details=[
                {"limit": f"{who}RequestRate", "rate": str(item), "retryAfterSeconds": retry_after}
            ],
            headers={"Retry-After": str(retry_after)},
        )


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
