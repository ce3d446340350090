"""The JSON a pipelined message is written in (``tasks.platform.pipelined._json``): orjson where it
writes what kombu's encoder would, kombu's encoder for everything else."""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from tasks.platform import pipelined


class Text(str):
    pass


class Number(enum.IntEnum):
    ONE = 1


@dataclass
class Point:
    x: int


PLAIN = [
    {"headers": {"id": "j-1", "timelimit": [None, 2.5], "retries": 0, "ignore_result": True}},
    {"text": "naïve ☃ \U0001f600", "tuple": (1, "two"), "nested": [{"a": None}], "neg": -3},
    {"number": Number.ONE},
    [1.5, 1e300, -0.0, 2**63 - 1],
]
NOT_PLAIN = [
    {"subclass": Text("kept as kombu writes it")},
    {"when": datetime(2026, 12, 6, 6, 0, tzinfo=UTC)},
    {"big": 2**70},
    {"dataclass": Point(1)},
]


@pytest.mark.parametrize("value", PLAIN)
def test_plain_values_read_as_kombus_encoder_writes_them(value: object) -> None:
    written = pipelined._json(value)
    assert isinstance(written, bytes)  # orjson's
    assert json.loads(written) == json.loads(pipelined._JSON.encode(value))


@pytest.mark.parametrize("value", NOT_PLAIN[:3])
def test_anything_else_is_kombus_encoder_whole(value: object) -> None:
    assert pipelined._json(value) == pipelined._JSON.encode(value)


def test_what_kombu_cannot_write_fails_as_it_does() -> None:
    with pytest.raises(TypeError):
        pipelined._JSON.encode(NOT_PLAIN[3])
    with pytest.raises(TypeError):
        pipelined._json(NOT_PLAIN[3])


def test_a_body_is_orjsons_only_when_its_caller_says_it_is_plain() -> None:
    data = {"id": uuid.UUID(int=7)}  # orjson would write it as plain text
    content_type, encoding, written = pipelined._serialized(data, "json")
    assert (content_type, encoding) == ("application/json", "utf-8")
    assert written == pipelined._JSON.encode(data)  # kombu's, unless the caller says plain
    assert '"__type__": "uuid"' in written
    event = {"uuid": "j-1", "timestamp": 1.5, "eta": None}
    assert json.loads(pipelined._serialized(event, "json", plain=True)[2]) == event
