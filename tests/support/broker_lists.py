"""A queue's waiting messages read straight from Redis's lists (kombu keeps one list per
priority), for tests that look at what was published with no worker consuming it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import text

from tasks.jobs.intake.tenancy import PRIORITY_STEPS
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction

SEP = "\x06\x16"  # kombu's separator between a queue's name and its priority


def list_key(queue: str, priority: int) -> str:
    return queue if priority == 0 else f"{queue}{SEP}{priority}"


def messages_in(queue: str, priority: int) -> list[dict[str, Any]]:
    """The messages waiting in one of ``queue``'s priority lists."""
    return [json.loads(raw) for raw in redis_client().lrange(list_key(queue, priority), 0, -1)]


def headers_in(queue: str) -> dict[str, dict[str, Any]]:
    """The headers of the messages waiting in any of ``queue``'s priority lists, by job id."""
    messages = [message for step in PRIORITY_STEPS for message in messages_in(queue, step)]
    return {message["headers"]["id"]: message["headers"] for message in messages}


@contextmanager
def idle_queue(prefix: str) -> Iterator[str]:
    """A queue of its own that no worker consumes; its lists and records go afterwards."""
    queue = f"{prefix}-{uuid.uuid4().hex[:10]}"
    yield queue
    redis_client().delete(*(list_key(queue, step) for step in PRIORITY_STEPS))
    with transaction() as session:
        session.execute(text("DELETE FROM jobs WHERE queue = :q"), {"q": queue})
