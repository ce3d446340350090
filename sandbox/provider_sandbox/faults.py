"""Failures on demand: errors, latency, timeouts, lost responses and rate limits.

The real provider fails in ways a campaign must survive, and a test can only
prove it survives them if they happen on cue. Each provider request draws its
fate from one seeded generator, always with the same number of draws, so a
sequential client replays exactly the same failures for the same seed.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from provider_sandbox.errors import InvalidRequest, RateLimited, Unavailable
from provider_sandbox.payloads import integer, number, only_fields

DROP_MODES = ("503", "close")
MAX_HOLD_MS = 600_000


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True)
class Faults:
    """The failure settings of ``PUT /admin/faults`` (all off by default)."""

    error_rate: float = 0.0
    latency_ms: float = 0
    latency_jitter_ms: float = 0
    timeout_rate: float = 0.0
    timeout_ms: float = 30_000
    drop_response_rate: float = 0.0
    drop_response_mode: str = "503"
    rate_limit_per_second: float | None = None
    seed: int | None = None
    path_contains: str | None = None  # strike only requests whose path contains this
    error_status: int = 503  # what an injected error answers (4xx: the provider refuses)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Faults:
        """Validate a whole faults document; absent fields take their defaults."""
        only_fields(body, JSON_NAMES.values())
        mode = body.get("dropResponseMode", "503")
        if mode not in DROP_MODES:
            raise InvalidRequest(f"dropResponseMode must be one of {', '.join(DROP_MODES)}")
        values: dict[str, Any] = {"drop_response_mode": mode}
        for field in ("error_rate", "timeout_rate", "drop_response_rate"):
            values[field] = number(body, JSON_NAMES[field], low=0, high=1)
        for field in ("latency_ms", "latency_jitter_ms", "timeout_ms"):
            values[field] = number(body, JSON_NAMES[field], low=0, high=MAX_HOLD_MS)
        values["rate_limit_per_second"] = number(body, "rateLimitPerSecond", low=0) or None
        values["seed"] = integer(body, "seed", low=0)
        scope = body.get("pathContains")
        if scope is not None and (not isinstance(scope, str) or not scope):
            raise InvalidRequest("pathContains must be a non-empty string")
        values["path_contains"] = scope
        status = integer(body, "errorStatus", low=400)
        if status is not None and status > 599:
            raise InvalidRequest("errorStatus must be an HTTP error status (400-599)")
        values["error_status"] = status
        defaults = cls()
        return cls(**{k: getattr(defaults, k) if v is None else v for k, v in values.items()})

    def to_json(self) -> dict[str, Any]:
        return {JSON_NAMES[name]: value for name, value in asdict(self).items()}


JSON_NAMES = {name: _camel(name) for name in Faults.__dataclass_fields__}


@dataclass(frozen=True)
class Fate:
    """What the faults decided for one request, drawn before it runs."""

    delay_s: float
    timeout: bool
    error: bool
    drop_response: bool


class TokenBucket:
    """``rate`` requests per second with a burst of one second's worth."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.updated = time.monotonic()

    def take(self) -> float:
        """Take a token: 0 when admitted, else the seconds until one is free."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Refused(InvalidRequest):
    """An injected refusal with the configured status (a provider rejecting our requests)."""

    code = "refused"

    def __init__(self, status: int) -> None:
        super().__init__("refused by fault injection")
        self.status = status


class FaultInjector:
    """Decides and inflicts, per provider request, the failure it meets."""

    def __init__(self, faults: Faults, stopping: threading.Event) -> None:
        self._lock = threading.Lock()
        self.stopping = stopping
        self.configure(faults)

    def configure(self, faults: Faults) -> None:
        """Apply new settings; a seed restarts the failure sequence from its start."""
        with self._lock:
            self.faults = faults
            self._random = random.Random(faults.seed)
            rate = faults.rate_limit_per_second
            self._bucket = TokenBucket(rate) if rate else None

    def admit(self) -> Fate:
        """Refuse the request over the rate limit, else draw its fate."""
        with self._lock:
            wait_s = self._bucket.take() if self._bucket else 0.0
            if wait_s:
                raise RateLimited(
                    details=[{"retryAfterMs": math.ceil(wait_s * 1000)}],
                    headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
                )
            return self._draw()

    def _draw(self) -> Fate:
        faults, draw = self.faults, self._random.random
        jitter, timeout, error, drop = draw(), draw(), draw(), draw()
        return Fate(
            delay_s=(faults.latency_ms + jitter * faults.latency_jitter_ms) / 1000,
            timeout=timeout < faults.timeout_rate,
            error=error < faults.error_rate,
            drop_response=drop < faults.drop_response_rate,
        )

    def inflict(self, fate: Fate) -> None:
        """Delay the request, and fail it before it runs if its fate says so."""
        if fate.delay_s:
            self.stopping.wait(fate.delay_s)
        if fate.timeout:
            # Longer than any sane client timeout; nothing is changed.
            self.stopping.wait(self.faults.timeout_ms / 1000)
            raise Unavailable("the provider timed out")
        if fate.error:
            if self.faults.error_status != Unavailable.status:
                raise Refused(self.faults.error_status)
            raise Unavailable()
