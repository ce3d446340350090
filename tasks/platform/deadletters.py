"""Dead letters: broker items no worker could read, kept aside per queue.

An item in a queue's Redis list that is not a message (not JSON, not a
kombu message, not a Celery task message) would otherwise kill the worker
that pops it, or be deleted with a log line. Keel's transport
(``tasks.platform.transport``) moves it here instead, exactly as it was popped, so an
operator can see what arrived and from where (``keel deadletters list``) and
then drop it. On RabbitMQ, the worker's consumer (``tasks.platform.consumer``) keeps
a message Celery cannot take here too, in the shape kombu's Redis transport
stores messages. Each queue has one list, newest first, bounded so that a
flood of junk cannot fill Redis — Keel's Redis, whichever the broker is.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from celery.utils.dispatch import Signal

KEY_PREFIX = "keel:dead-letters:"
MAX_KEPT = 10_000  # per queue; the oldest fall off


# Sent once an item was set aside: ``sender`` is its ``DeadLetter``; ``job_id`` and ``name``
# are the job and task its payload claims, if any (``tasks.platform.transport.task_of``).
dead_lettered = Signal(name="dead_lettered")


def key(queue: str) -> str:
    return f"{KEY_PREFIX}{queue}"


@dataclass(frozen=True)
class DeadLetter:
    """One unreadable item: where it was (``source``, the Redis list) and why it was set aside."""

    id: str
    queue: str
    source: str
    reason: str
    time: float
    raw: str
    encoding: str  # "utf-8", or "base64" when the item was not text

    @classmethod
    def of(cls, queue: str, source: str, raw: bytes | str, reason: str) -> DeadLetter:
        if isinstance(raw, str):
            text, encoding = raw, "utf-8"
        else:
            try:
                text, encoding = raw.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                text, encoding = base64.b64encode(raw).decode("ascii"), "base64"
        return cls(uuid.uuid4().hex, queue, source, reason, round(time.time(), 3), text, encoding)

    @classmethod
    def from_json(cls, document: bytes | str) -> DeadLetter:
        return cls(**json.loads(document))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def raw_bytes(self) -> bytes:
        if self.encoding == "base64":
            return base64.b64decode(self.raw)
        return self.raw.encode("utf-8")


def add(pipe: Any, letter: DeadLetter) -> None:
    """Queue the commands that keep ``letter`` on ``pipe`` (a redis-py pipeline); caller executes.

    A pipeline, so that moving an item here and removing it from where it was
    can be one transaction.
    """
    pipe.lpush(key(letter.queue), letter.to_json())
    pipe.ltrim(key(letter.queue), 0, MAX_KEPT - 1)


def queues(client: Any) -> list[str]:
    """Queues that have dead letters."""
    found = {k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(f"{KEY_PREFIX}*")}
    return sorted(name[len(KEY_PREFIX) :] for name in found)


def entries(client: Any, queue: str) -> list[tuple[bytes, DeadLetter]]:
    """Each stored document of ``queue`` with its letter, newest first."""
    return [(doc, DeadLetter.from_json(doc)) for doc in client.lrange(key(queue), 0, -1)]


def drop(client: Any, queue: str, ids: set[str] | None = None) -> list[str]:
    """Remove the letters of ``queue`` named by ``ids`` (all when None); their ids."""
    # By document, not DEL: a letter that arrives meanwhile was never listed, so it stays.
    chosen = [
        (doc, letter) for doc, letter in entries(client, queue) if ids is None or letter.id in ids
    ]
    pipe = client.pipeline(transaction=False)
    for document, _ in chosen:
        pipe.lrem(key(queue), 1, document)
    pipe.execute()
    return [letter.id for _, letter in chosen]
