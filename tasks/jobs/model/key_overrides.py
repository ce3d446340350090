"""Which override of a job type's key limits a key takes: the rules, with no I/O.

An override (``tasks.jobs.run.live_key_limits`` keeps them) names a job type, a tenant
(``*``: any tenant's jobs, the system's included) and a key pattern: one key (``partner-7``)
or a pattern where ``*`` stands for any run of characters (``partner-*``; ``*`` alone: every
key). Every other character is itself, so a key holding ``?`` or ``[`` is named as it is;
a key that limits keep as its SHA-256 (over 100 characters, or not printable) is named by
that form (``sha256:…``).
It gives ``max_running``, ``rate`` or both; ``None`` lifts that limit; a field it leaves out
is not its to say.

Precedence, field by field (``max_running`` and ``rate`` each from the most specific
override of the key that gives it, else the job type's declaration):

1. the key: an exact key beats a pattern, a pattern beats ``*``; of two patterns, the one
   with more characters other than ``*`` (``partner-eu-*`` beats ``partner-*``);
2. then the tenant: the key's own tenant beats ``*``;
3. a tie left (``a*`` and ``*a`` both match ``aa``): the pattern first in text order.

So an incident rule on one key (``*``, ``partner-7``) holds for every tenant, a premium
tenant's rule (``acme``, ``*``) raises acme's limit on the other keys, and an exact key of
one tenant is the last word on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
from tasks.platform.ids import has_control

ANY_TENANT = "*"
WILDCARD = "*"
FIELDS = ("max_running", "rate")
MAX_RUNNING = 10_000  # as ``KeyConcurrency`` takes it
MAX_RATE = 1_000_000
MAX_PER_MS = 86_400_000  # a day, as ``KeyRate`` takes it
MAX_PATTERN_CHARS = 100  # a key is at most 100 (longer: its "sha256:..." form)


class OverrideRefused(ValueError):
    """An override that cannot be kept: ``field`` says which of its fields, ``message`` why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split(WILDCARD)), re.S)


def key_matches(pattern: str, key: str) -> bool:
    """Whether ``pattern`` (a key, or a pattern with ``*``) names ``key``."""
    if WILDCARD not in pattern:
        return pattern == key
    return _compiled(pattern).fullmatch(key) is not None


def key_rank(pattern: str) -> tuple[int, int]:
    """How specific a key pattern is: (exact 2, pattern 1, ``*`` 0; its literal characters)."""
    literal = len(pattern.replace(WILDCARD, ""))
    if WILDCARD not in pattern:
        return 2, literal
    return (1 if literal else 0), literal


@dataclass(frozen=True)
class KeyOverride:
    """One override: ``limits`` holds the fields it gives (``FIELDS``; ``rate`` as
    ``{"max": n, "per_ms": ms}``; ``None``: no such limit)."""

    job_name: str
    tenant: str
    key: str
    limits: Mapping[str, Any]

    def matches(self, tenant: str | None, key: str) -> bool:
        """Whether it holds for ``tenant``'s (``None``: the system's) job of ``key``."""
        if self.tenant != ANY_TENANT and self.tenant != tenant:
            return False
        return key_matches(self.key, key)

    @property
    def precedence(self) -> tuple[int, int, int]:
        """The higher, the more specific (see the module)."""
        kind, literal = key_rank(self.key)
        return kind, literal, int(self.tenant != ANY_TENANT)


def ordered(overrides: Iterable[KeyOverride]) -> list[KeyOverride]:
    """``overrides`` most specific first: the first that matches and gives a field wins it
    (a tie: the pattern first in text order; sorted is stable)."""
    by_text = sorted(overrides, key=lambda o: (o.key, o.tenant))
    return sorted(by_text, key=lambda o: o.precedence, reverse=True)


def deciding(
    overrides: Iterable[KeyOverride], tenant: str | None, key: str, field: str
) -> KeyOverride | None:
    """The override that decides ``field`` for ``tenant``'s job of ``key`` (``None``: the
    declaration does). ``overrides`` are one job type's, in ``ordered`` order."""
    for override in overrides:
        if field in override.limits and override.matches(tenant, key):
            return override
    return None


def concurrency_of(declared: KeyConcurrency, override: KeyOverride | None) -> KeyConcurrency | None:
    """The key concurrency in force: the declared one with ``override``'s ``max_running``
    (``None``: no concurrency limit for the key)."""
    if override is None:
        return declared
    running = override.limits["max_running"]
    return None if running is None else replace(declared, max_running=int(running))


def rate_of(declared: KeyRate, override: KeyOverride | None) -> KeyRate | None:
    """The key rate in force: the declared one with ``override``'s (``None``: no rate)."""
    if override is None:
        return declared
    rate = override.limits["rate"]
    if rate is None:
        return None
    return replace(declared, max=int(rate["max"]), per=int(rate["per_ms"]))


def checked(
    given: Mapping[str, Any], concurrency: KeyConcurrency | None, rate: KeyRate | None
) -> dict[str, Any]:
    """The override kept for the fields ``given`` of a job type that declares ``concurrency``
    and ``rate``; ``OverrideRefused`` names what is wrong.

    A field may override only a limit the job type declares (the key it counts by is the
    declaration's), and ``max_running`` only with the ``queue`` strategy (the others keep
    one job of a key).
    """
    unknown = set(given) - set(FIELDS)
    if unknown or not given:
        raise OverrideRefused("limits", f"give max_running or rate (not {sorted(unknown)})")
    if "max_running" in given:
        _check_running(given["max_running"], concurrency)
    if "rate" in given:
        _check_rate(given["rate"], rate)
    return {name: given[name] for name in FIELDS if name in given}


def _check_running(running: Any, declared: KeyConcurrency | None) -> None:
    if declared is None:
        raise OverrideRefused("max_running", "the job type declares no key_concurrency to override")
    if declared.strategy != "queue":
        raise OverrideRefused(
            "max_running", f"the {declared.strategy} strategy keeps one job of a key"
        )
    if running is not None and not (
        isinstance(running, int) and not isinstance(running, bool) and 1 <= running <= MAX_RUNNING
    ):
        raise OverrideRefused("max_running", f"1 to {MAX_RUNNING} or null, not {running!r}")


def _check_rate(rate: Any, declared: KeyRate | None) -> None:
    if declared is None:
        raise OverrideRefused("rate", "the job type declares no key_rate to override")
    if rate is None:
        return
    if not isinstance(rate, Mapping) or set(rate) != {"max", "per_ms"}:
        raise OverrideRefused("rate", f"{{max, per_ms}} or null, not {rate!r}")
    for name, top in (("max", MAX_RATE), ("per_ms", MAX_PER_MS)):
        value = rate[name]
        if isinstance(value, bool) or not (isinstance(value, int) and 1 <= value <= top):
            raise OverrideRefused(f"rate.{name}", f"1 to {top}, not {value!r}")


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot name keys (``None``: it can)."""
    if not pattern or len(pattern) > MAX_PATTERN_CHARS:
        return f"1 to {MAX_PATTERN_CHARS} characters"
    if has_control(pattern):
        return "no control character nor line break"
    return None
