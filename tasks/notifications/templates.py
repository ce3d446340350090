"""Message templates: ``{name}`` placeholders, and how long a rendered message can get.

A template is short, but each placeholder repeats its value: ``"{a}" * 666``
with a 300 KB value renders 200 MB per message. So the length of every
message is known before anything is rendered — from the template and each
recipient's values — and a campaign whose longest message the provider would
refuse is refused when it is created. A worker then renders a bounded amount
at a time (``TEXT_PER_REQUEST``), however long the messages are.
"""

from __future__ import annotations

import string
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tasks.notifications.provider import MAX_MESSAGES_PER_REQUEST, MAX_TEXT_LENGTH

# Rendered text held at once by a worker loading a chunk (one provider request).
TEXT_PER_REQUEST = 1_000_000

__all__ = ["MAX_TEXT_LENGTH", "Shape", "batches", "longest", "render"]


def render(template: str, values: dict[str, Any]) -> str:
    """``{name}`` placeholders; missing values render empty rather than failing a send."""
    return string.Formatter().vformat(template, (), defaultdict(str, values))


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
