"""What the broker holds: the task ids of a queue's messages, and of the tasks they wait for.

Read the way kombu's Redis transport stores messages: a queue is one list
per priority step (``Channel._q_for_pri`` over ``priority_steps``); a message
a worker has reserved but not acknowledged is kept in the ``unacked`` hash as
``[message, exchange, routing_key]``; a message's ``headers.id`` is its task
id (Celery's message protocol 2). A message's body also names the tasks that
run after it — its chord callback, the rest of its chain, its links — whose
jobs legitimately have no message of their own yet: those ids are collected
as ``waited_for``.

Reading is bounded: a place holding more than ``limit`` messages is not read
(``TooMany``), so one round never costs more than ``limit`` decodes.

Redis only: a RabbitMQ queue cannot be listed (see ``tasks.jobs.upkeep.reconcile``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tasks.jobs.model.errors import Refused
from tasks.platform.celery_app import app

PAGE = 1000
MAX_DEPTH = 32  # of nested signatures in a message body; deeper ones are not searched


class TooMany(Refused):
    """The broker holds more messages there than one reconcile round reads."""

    code = "too_many_messages"


@dataclass
class Contents:
    """Task ids found in the broker: messages (``ids``) and the tasks they lead to.

    What the messages lead to is read only when asked about a job that has no
    message itself (decoding every body would triple the cost of a round that,
    most of the time, finds every job in place).
    """

    ids: set[str] = field(default_factory=set)
    messages: list[dict[str, Any]] = field(default_factory=list)
    _waited_for: set[str] | None = None

    def holds(self, job_id: str) -> bool:
        return job_id in self.ids or job_id in self.waited_for

    @property
    def waited_for(self) -> set[str]:
        if self._waited_for is None:
            self._waited_for = set()
            for message in self.messages:
                self._waited_for |= task_ids_in(_embedded(message))
        return self._waited_for

    def add(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        headers = message.get("headers")
        if isinstance(headers, dict) and isinstance(headers.get("id"), str):
            self.ids.add(headers["id"])
        self.messages.append(message)


def task_ids_in(value: Any, depth: int = 0) -> set[str]:
    """Every ``task_id`` named anywhere in a (serialized) signature, chain or chord."""
    found: set[str] = set()
    if depth > MAX_DEPTH:
        return found
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "task_id" and isinstance(item, str):
                found.add(item)
            else:
                found |= task_ids_in(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            found |= task_ids_in(item, depth + 1)
    return found


def _embedded(message: dict[str, Any]) -> Any:
    """The ``embed`` part of a protocol 2 body (``[args, kwargs, embed]``), or None."""
    body: Any = message.get("body")
    properties = message.get("properties") or {}
    try:
        if isinstance(properties, dict) and properties.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        decoded = json.loads(body)
    except (TypeError, ValueError):
        return None
    return decoded[2] if isinstance(decoded, list) and len(decoded) == 3 else None


def _decode(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:  # a poison item: the transport dead-letters it when it is popped
        return None


@contextmanager
def _channel() -> Iterator[Any]:
    with app.connection_for_read() as connection:
        yield connection.default_channel


def _pages(client: Any, key: str, size: int) -> Iterable[list[bytes]]:
    for start in range(0, size, PAGE):
        yield client.lrange(key, start, start + PAGE - 1)


def queue_contents(queue: str, limit: int) -> Contents:
    """The messages waiting in ``queue`` (every priority list); ``TooMany`` past ``limit``."""
    contents = Contents()
    with _channel() as channel, channel.conn_or_acquire() as client:
        keys = [channel._q_for_pri(queue, step) for step in channel.priority_steps]
        sizes = dict(zip(keys, [client.llen(key) for key in keys], strict=True))
        if sum(sizes.values()) > limit:
            raise TooMany(f"queue {queue} holds {sum(sizes.values())} messages (> {limit})")
        for key, size in sizes.items():
            for page in _pages(client, key, size):
                for raw in page:
                    contents.add(_decode(raw))
    return contents


def unacked_contents(limit: int) -> Contents:
    """The messages workers reserved and have not acknowledged; ``TooMany`` past ``limit``."""
    contents = Contents()
    with _channel() as channel, channel.conn_or_acquire() as client:
        held = client.hlen(channel.unacked_key)
        if held > limit:
            raise TooMany(f"{held} messages are reserved by workers (> {limit})")
        for _, raw in client.hscan_iter(channel.unacked_key, count=PAGE):
            entry = _decode(raw)
            if isinstance(entry, list) and entry:
                contents.add(entry[0])
    return contents
