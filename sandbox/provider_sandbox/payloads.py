"""Strict reading of request bodies and queries.

A fake provider that accepted sloppy input would let client bugs through that
the real one rejects, so every body is a JSON object with known fields only,
and anything else is a 400 with the offending fields listed in ``details``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Request

from provider_sandbox.errors import InvalidRequest, TooManyMessages

MAX_MESSAGES_PER_REQUEST = 1000
MAX_ID_LENGTH = 256
MAX_TEXT_LENGTH = 10_000
MAX_PROBLEMS_LISTED = 20
MESSAGE_FIELDS = frozenset({"messageId", "to", "text"})


@dataclass(frozen=True)
class Message:
    """One message to one recipient, as the client sent it."""

    message_id: str
    to: str
    text: str


def json_object(request: Request, *, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object (``{}`` for an empty optional body)."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        if required:
            raise InvalidRequest("a JSON object body is required")
        return {}
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise InvalidRequest("the body is not valid JSON", details=[str(error)]) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    return body


def only_fields(body: Mapping[str, Any], allowed: Iterable[str], where: str = "body") -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        details = [{"field": name, "problem": "unknown field"} for name in unknown]
        raise InvalidRequest(
            f"unknown fields in the {where}: {', '.join(unknown)}", details=details
        )


def group_name(body: Mapping[str, Any]) -> str | None:
    only_fields(body, {"name"})
    name = body.get("name")
    if name is not None and not _short_string(name, allow_empty=True):
        raise InvalidRequest(f"name must be a string of at most {MAX_ID_LENGTH} characters")
    return name


def messages(body: Mapping[str, Any]) -> list[Message]:
    """The ``messages`` of an add request, all valid or a 400 naming the bad ones."""
    only_fields(body, {"messages"})
    items = body.get("messages")
    if not isinstance(items, list) or not items:
        raise InvalidRequest("messages must be a non-empty list")
    if len(items) > MAX_MESSAGES_PER_REQUEST:
        raise TooManyMessages(
            f"at most {MAX_MESSAGES_PER_REQUEST} messages per request, got {len(items)}",
            details=[{"field": "messages", "max": MAX_MESSAGES_PER_REQUEST, "got": len(items)}],
        )
    problems = [
        problem
        for index, item in enumerate(items)
        if not _is_valid_message(item)
        for problem in _message_problems(index, item)
    ]
    if problems:
        raise InvalidRequest(
            f"{len(problems)} invalid message fields", details=problems[:MAX_PROBLEMS_LISTED]
        )
    return [Message(item["messageId"], item["to"], item["text"]) for item in items]


def _is_valid_message(item: Any) -> bool:
    """The fast check every message takes; only failures are explained."""
    return (
        isinstance(item, dict)
        and item.keys() == MESSAGE_FIELDS
        and _short_string(item["messageId"])
        and _short_string(item["to"])
        and isinstance(item["text"], str)
        and len(item["text"]) <= MAX_TEXT_LENGTH
    )


def _message_problems(index: int, item: Any) -> list[dict[str, str]]:
    where = f"messages[{index}]"
    if not isinstance(item, dict):
        return [{"field": where, "problem": "must be an object"}]
    problems = [
        {"field": f"{where}.{name}", "problem": "unknown field"}
        for name in sorted(set(item) - MESSAGE_FIELDS)
    ]
    for name in ("messageId", "to"):
        if not _short_string(item.get(name)):
            problem = f"must be a non-empty string of <= {MAX_ID_LENGTH}"
            problems.append({"field": f"{where}.{name}", "problem": problem})
    text = item.get("text")
    if not isinstance(text, str) or len(text) > MAX_TEXT_LENGTH:
        problems.append(
            {"field": f"{where}.text", "problem": f"must be a string of <= {MAX_TEXT_LENGTH}"}
        )
    return problems


def _short_string(value: Any, *, allow_empty: bool = False) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= MAX_ID_LENGTH
        and (allow_empty or not (value == "" or value.isspace()))
    )


def number(
    body: Mapping[str, Any], name: str, *, low: float, high: float = math.inf
) -> float | None:
    """A finite number in ``[low, high]``, or ``None`` when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a number", details=[{"field": name}])
    if not low <= value <= high:
        raise InvalidRequest(
            f"{name} must be between {low:g} and {high:g}", details=[{"field": name}]
        )
    return value


def integer(body: Mapping[str, Any], name: str, *, low: int) -> int | None:
    """An integer ``>= low``, or ``None`` when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidRequest(f"{name} must be an integer >= {low}", details=[{"field": name}])
    return value


def flag(request: Request, name: str) -> bool:
    value = request.args.get(name, "0").lower()
    if value not in {"0", "1", "true", "false", ""}:
        raise InvalidRequest(f"{name} must be 1/0 or true/false", details=[{"field": name}])
    return value in {"1", "true"}
