"""Limits by key, as a job type declares them: how many of a key's jobs may run at once, and
how many may start per window.

The limit users of a queue ask for most is per key, not per queue: "at most one sync per
customer at a time", "10 calls per minute per API key". A job type declares the key once
(``handler(..., key_concurrency=KeyConcurrency("customerId"))``, or the same attribute on a
``KeelTask``), and each job's key is read from its data when it is delivered. The limits
hold across every worker and host (``tasks.jobs.run.key_limits``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: What a new job of a key does when its key's jobs already run (or wait):
#: ``queue``: waits its turn, first come first run (the others keys' jobs go on);
#: ``cancel_in_progress``: the newest wins: the key's running jobs are aborted and its
#: waiting ones cancelled; ``cancel_newest``: the first wins: the new job is cancelled.
Strategy = Literal["queue", "cancel_in_progress", "cancel_newest"]
STRATEGIES: tuple[Strategy, ...] = ("queue", "cancel_in_progress", "cancel_newest")

#: A field of the job's data (a Celery-style task's: of its keyword arguments), or a function
#: of that mapping. No value (``None``, missing, ``""``): the job has no key, no limit applies.
KeySource = str | Callable[[Mapping[str, Any]], object]

# A key longer than this is kept as its SHA-256 (Redis key names stay short).
MAX_KEY_CHARS = 100
_PER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def _check_source(key: object) -> None:
    if not (callable(key) or (isinstance(key, str) and key.strip())):
        raise ValueError(f"a limit's key is a field name or a function of the data, not {key!r}")


@dataclass(frozen=True)
class KeyConcurrency:
    """At most ``max_running`` jobs of one key run at once; ``strategy`` says what a new one
    does meanwhile (``Strategy``)."""

    key: KeySource
    max_running: int = 1
    strategy: Strategy = "queue"

    def __post_init__(self) -> None:
        _check_source(self.key)
        if isinstance(self.max_running, bool) or not (
            isinstance(self.max_running, int) and 1 <= self.max_running <= 10_000
        ):
            raise ValueError(f"max_running must be 1 to 10000, not {self.max_running!r}")
        if self.strategy not in STRATEGIES:
            choices = ", ".join(STRATEGIES)
            raise ValueError(f"strategy must be one of {choices}, not {self.strategy!r}")
        if self.strategy != "queue" and self.max_running != 1:
            raise ValueError(f"the {self.strategy} strategy keeps one job of a key: max_running=1")


@dataclass(frozen=True)
class KeyRate:
    """At most ``max`` starts of one key's jobs per ``per`` (``"500ms"``, ``"1s"``, ``"1m"``,
    ``"1h"``, or milliseconds); a job over it waits, parked, without using an attempt."""

    key: KeySource
    max: int
    per: str | int = "1s"

    def __post_init__(self) -> None:
        _check_source(self.key)
        if isinstance(self.max, bool) or not (isinstance(self.max, int) and self.max >= 1):
            raise ValueError(f"a key rate's max must be a positive number, not {self.max!r}")
        if not 1 <= self.per_ms <= 86_400_000:
            raise ValueError(f"a key rate's window must be 1 ms to a day, not {self.per!r}")

    @property
    def per_ms(self) -> int:
        return window_ms(self.per)


def window_ms(per: str | int) -> int:
    """``"1m"`` → 60000; an int is milliseconds already."""
    if isinstance(per, int) and not isinstance(per, bool):
        return per
    found = _PER.match(per) if isinstance(per, str) else None
    if found is None:
        raise ValueError(f"a window is like '500ms', '1s', '1m' or '1h', not {per!r}")
    return int(float(found.group(1)) * _UNIT_MS[found.group(2)])


def key_value(source: KeySource, data: Mapping[str, Any]) -> str | None:
    """The key of a job with ``data`` (``None``: it has none, no limit applies to it)."""
    return key_text(source(data) if callable(source) else data.get(source))


def key_text(value: object) -> str | None:
    """A key's value as the limits name it (``None`` or ``""``: no key)."""
    if value is None or value == "":
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) > MAX_KEY_CHARS or not text.isprintable():
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text
