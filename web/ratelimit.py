"""A per-tenant request rate limit, shared by every API process through Redis.

One tenant's flood must not starve another, so the budget is per tenant (taken
from the verified token, never from the request) and every API replica counts
against the same Redis moving window. Past the limit a request is answered 429
with ``Retry-After``.

``KEEL_TENANT_RATE_LIMIT`` (env, or app config in tests) sets the limit in the
``limits`` notation, e.g. ``600/minute``; ``off`` disables it. The default is
generous: the limit is a guard against floods, not a quota.

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
import os
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

DEFAULT_LIMIT = "6000/minute"
EXTENSION = "keel_ratelimit"
KEY_PREFIX = "keel:ratelimit"
# After Redis fails, skip the limiter this long, so a dead Redis does not add a
# connection attempt (and a log line) to every request.
BACKOFF_S = 5.0
# A Redis that does not answer quickly is treated as down: the API must not hang on it.
REDIS_TIMEOUT_S = 0.5


@dataclass
class TenantRateLimiter:
    """A moving-window limit per tenant in Redis, failing open when Redis is down."""

    item: RateLimitItem | None
    storage_url: str | None = None  # None: the stack's Redis (KEEL_REDIS_URL), read on first use
    _limiter: MovingWindowRateLimiter | None = None
    _down_until: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _strategy(self) -> MovingWindowRateLimiter:
        with self._lock:
            if self._limiter is None:
                storage = storage_from_string(
                    self.storage_url or get_settings().broker_url,
                    key_prefix=KEY_PREFIX,
                    socket_connect_timeout=REDIS_TIMEOUT_S,
                    socket_timeout=REDIS_TIMEOUT_S,
                )
                self._limiter = MovingWindowRateLimiter(storage)
            return self._limiter

    def check(self, tenant_id: str) -> None:
        """Count one request for ``tenant_id``; raise 429 past the limit."""
        shared = self.storage_url is None  # the stack's Redis, which tasks.broker watches too
        if self.item is None or time.monotonic() < self._down_until:
            return
        if shared and broker.unreachable():
            return
        started = time.monotonic()
        try:
            limiter = self._strategy()
            if limiter.hit(self.item, tenant_id):
                return
            reset_at = limiter.get_window_stats(self.item, tenant_id).reset_time
        except Exception as exc:  # any storage failure: fail open, never 500
            if shared:
                broker.failed(exc, started)
            self._down_until = time.monotonic() + BACKOFF_S
            log.warning("tenant rate limit unavailable, letting requests through: %s", exc)
            return
        retry_after = max(1, math.ceil(reset_at - time.time()))
        raise ApiError(
            429,
            f"tenant request rate limit exceeded ({self.item}); retry after {retry_after}s",
            details=[{"limit": str(self.item), "retryAfterSeconds": retry_after}],
            headers={"Retry-After": str(retry_after)},
        )


def _parse(limit: str) -> RateLimitItem | None:
    if limit.strip().lower() in ("", "off", "none", "0"):
        return None
    try:
        return parse(limit)
    except ValueError:
        raise RuntimeError(
            f"KEEL_TENANT_RATE_LIMIT={limit!r} is not a rate such as '600/minute'"
        ) from None


def init_app(app: Flask) -> None:
    """Read the limit (test config wins over env) and attach the limiter to ``app``."""
    app.config.setdefault(
        "KEEL_TENANT_RATE_LIMIT", os.environ.get("KEEL_TENANT_RATE_LIMIT", DEFAULT_LIMIT)
    )
    app.config.setdefault("KEEL_RATELIMIT_STORAGE_URL", None)
    app.extensions[EXTENSION] = TenantRateLimiter(
        _parse(str(app.config["KEEL_TENANT_RATE_LIMIT"])), app.config["KEEL_RATELIMIT_STORAGE_URL"]
    )


def check(tenant_id: str) -> None:
    """Apply the current app's tenant limit (apps without one are unlimited)."""
    limiter: TenantRateLimiter | None = current_app.extensions.get(EXTENSION)
    if limiter is not None:
        limiter.check(tenant_id)
