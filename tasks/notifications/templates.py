"""Message templates: ``{name}`` placeholders, and how long a rendered message can get.

A template is short, but each placeholder repeats its value: ``"{a}" * 666``
with a 300 KB value renders 200 MB per message. So the length of every
message is known before anything is rendered — from the template and each
recipient's values — and a campaign whose longest message the provider would
refuse is refused when it is created. A worker then renders a bounded amount
at a time (``TEXT_PER_REQUEST``), however long the messages are.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tasks.notifications.provider import MAX_MESSAGES_PER_REQUEST, MAX_TEXT_LENGTH

# Rendered text held at once by a worker loading a chunk (one provider request).
TEXT_PER_REQUEST = 1_000_000

__all__ = ["MAX_TEXT_LENGTH", "Shape", "batches", "longest", "render"]


class _Blank(dict[str, Any]):
    """The values of one message; a placeholder without one renders empty."""

    def __missing__(self, key: str) -> str:
        return ""


def render(template: str, values: dict[str, Any]) -> str:
    """``{name}`` placeholders; missing values render empty rather than failing a send.

    Only plain names (``PLACEHOLDERS``: what the API accepts): attribute or index
    access, positional fields and format specs are refused, not rendered. ``str.format_map``
    renders in C, several times faster than ``string.Formatter`` (a million messages per
    campaign).
    """
    return plain(template).format_map(_Blank(values))


#: A template of ``{name}`` placeholders only (and ``{{``/``}}`` for literal braces).
PLACEHOLDERS = r"^(?:[^{}]|\{\{|\}\}|\{[A-Za-z_][A-Za-z0-9_]*\})*$"
_PLAIN = re.compile(PLACEHOLDERS)


@lru_cache(maxsize=256)
def plain(template: str) -> str:
    """``template`` itself, if its placeholders are plain names; else ``ValueError``.

    ``str.format``'s attribute access (``{to.__class__}``), positional fields and
    format specs (``{to:>2000000000}`` makes a 2 GB string) are not part of the
    contract: the API refuses them, and a worker never renders one.
    """
    if not _PLAIN.fullmatch(template):
        raise ValueError("only {name} placeholders (letters, digits and _) may be used")
    return template


@dataclass(frozen=True)
class Shape:
    """A template reduced to its fixed text and how often each placeholder appears."""

    fixed: int
    uses: dict[str, int]

    @classmethod
    def of(cls, template: str) -> Shape:
        parsed = list(string.Formatter().parse(template))
        uses = Counter(field for _, field, _, _ in parsed if field is not None)
        return cls(sum(len(literal) for literal, _, _, _ in parsed), dict(uses))

    def length(self, values: dict[str, Any]) -> int:
        """The rendered length for ``values``, without rendering (as ``render`` formats them)."""
        return self.fixed + sum(
            self.uses[name] * len(format(value, ""))
            for name, value in values.items()
            if name in self.uses
        )


def longest(template: str, recipients: Iterable[dict[str, Any]]) -> int:
    """The longest message ``template`` renders for any of ``recipients``' values."""
    shape = Shape.of(template)
    return max((shape.length(values) for values in recipients), default=shape.fixed)


def batches(messages: Iterable[dict[str, str]]) -> Iterator[list[dict[str, str]]]:
    """Provider requests: at most ``MAX_MESSAGES_PER_REQUEST`` messages and about
    ``TEXT_PER_REQUEST`` characters of text each (a single message may exceed it)."""
    batch: list[dict[str, str]] = []
    size = 0
    for message in messages:
        if batch and (
            len(batch) == MAX_MESSAGES_PER_REQUEST or size + len(message["text"]) > TEXT_PER_REQUEST
        ):
            yield batch
            batch, size = [], 0
        batch.append(message)
        size += len(message["text"])
    if batch:
        yield batch
