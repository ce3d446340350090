"""Searching jobs by their data: the terms a user writes, read into containment conditions.

A job's ``data`` is a JSON object; a search asks which jobs' data *contain* a
given object (Postgres ``data @> '{...}'``, answered by the GIN index
``ix_jobs_data``). Users write it one of two ways, the same in the API, the CLI
and the dashboard:

- a **term** ``path=value``: ``customerId=42``, ``customer.region=eu-west-1``
  (``GET /api/v1/jobs?data.customerId=42``, ``keel jobs list --data customerId=42``).
  The path is dot-separated keys. A value is matched as what it reads as *and*
  as text: ``42`` finds ``{"customerId": 42}`` and ``{"customerId": "42"}``;
  ``true``, ``false`` and ``null`` likewise; a value in double quotes
  (``"42"``) is a JSON string and matches that string only; anything else is text.
- a **JSON object**, for what a term cannot say (keys with dots or spaces, arrays:
  ``{"tags": ["vip"]}`` finds data whose ``tags`` hold ``"vip"``).

Several terms all hold (AND). Pure logic: the store turns each condition into SQL.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from tasks.platform.ids import has_control

MAX_TERMS = 8  # conditions in one search
MAX_DEPTH = 8  # keys in one path
MAX_TEXT = 2000  # characters of one search's data text
MAX_NESTING = 32  # levels of a JSON object searched for
_KEY = re.compile(r"[A-Za-z0-9_$@-]{1,100}")


class SearchRefused(ValueError):
    """A search the user wrote that cannot be read (the message says why)."""


@dataclass(frozen=True)
class DataMatch:
    """One condition: the job's data contains one of ``alternatives`` (JSON texts)."""

    alternatives: tuple[str, ...]

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [json.loads(alternative) for alternative in self.alternatives]


def _nested(keys: list[str], value: Any) -> dict[str, Any]:
    for key in reversed(keys[1:]):
        value = {key: value}
    return {keys[0]: value}


def _values(raw: str) -> list[Any]:
    """What ``raw`` may match: as it reads as JSON (a number, true, false, null, a quoted
    string) and as text, unless it is quoted, which means that string only."""
    if has_control(raw):
        raise SearchRefused("a value may not hold a control character")
    if raw.startswith('"'):
        try:
            quoted = _json(raw)
        except ValueError:
            raise SearchRefused(
                f"{raw!r} is not a JSON string a search can hold (a quote opens it)"
            ) from None
        if not isinstance(quoted, str):
            raise SearchRefused(f"{raw!r} is not a JSON string (a quote opens it)")
        return [quoted]
    try:
        read = _json(raw)
    except ValueError:
        return [raw]
    if isinstance(read, (dict, list)):
        return [read]  # an object or array value: containment of it
    return [read, raw]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: text


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON Postgres cannot hold
        raise ValueError(f"{text} is past a float's range")
    return value


def _json(text: str) -> Any:
    """``text`` read as JSON a search can send to Postgres (``ValueError`` otherwise): finite
    numbers, no NUL nor lone surrogate in a string, at most ``MAX_NESTING`` deep."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deep") from None
    _check(value, 0)
    return value


def _check(value: Any, depth: int) -> None:
    if depth > MAX_NESTING:
        raise ValueError(f"nested deeper than {MAX_NESTING}")
    if isinstance(value, str):
        if "\x00" in value or any("\ud800" <= c <= "\udfff" for c in value):
            raise ValueError("a string holds NUL or a lone surrogate")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(key, depth + 1)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)


def term(path: str, raw: str) -> DataMatch:
    """``path=raw`` as a condition (``customer.id``, ``42``)."""
    keys = path.split(".")
    if len(keys) > MAX_DEPTH or not all(_KEY.fullmatch(key) for key in keys):
        raise SearchRefused(
            f"{path!r} is not a data path: dot-separated keys of letters, digits, _ $ @ -, "
            f"at most {MAX_DEPTH} (a JSON object says any other key)"
        )
    if raw == "":
        raise SearchRefused(f"{path}= needs a value")
    alternatives = dict.fromkeys(json.dumps(_nested(keys, v), sort_keys=True) for v in _values(raw))
    return DataMatch(tuple(alternatives))


def _whole(text: str) -> DataMatch:
    try:
        given = _json(text)
    except ValueError as exc:
        raise SearchRefused(f"not a JSON object: {exc}") from None
    if not isinstance(given, dict) or not given:
        raise SearchRefused("a JSON object with at least one key is needed")
    return DataMatch((json.dumps(given, sort_keys=True),))


def parse(text: str) -> tuple[DataMatch, ...]:
    """A search's data text: a JSON object, or ``path=value`` terms separated by spaces."""
    text = text.strip()
    if not text:
        raise SearchRefused("the data search is empty")
    if len(text) > MAX_TEXT:
        raise SearchRefused(f"the data search is longer than {MAX_TEXT} characters")
    if text.startswith("{"):
        return (_whole(text),)
    matches = []
    for word in text.split():
        path, equals, raw = word.partition("=")
        if not equals:
            raise SearchRefused(f"{word!r} is not path=value (e.g. customerId=42)")
        matches.append(term(path, raw))
    return checked(matches)


def checked(matches: list[DataMatch]) -> tuple[DataMatch, ...]:
    if len(matches) > MAX_TERMS:
        raise SearchRefused(f"at most {MAX_TERMS} data conditions in one search")
    return tuple(matches)
