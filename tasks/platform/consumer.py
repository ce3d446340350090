"""Keel's worker consumer: Celery's, except that a message it cannot take is dead-lettered
(and that its task events leave in batches: ``tasks.platform.celery_events``).

kombu has delivered a message (on Redis, ``tasks.platform.transport`` saw to it
that it is readable; RabbitMQ delivers any body with its properties, and
kombu decodes nothing yet); Celery's consumer now reads it as a task
message. Where Celery knows the message is bad (no task header, an
invalid task: ``task_rejected``) it rejects it, or acks a body it cannot
deserialize, and the message would be gone: it is kept in the queue's dead
letters instead. Where Celery does not
expect the flaw (a task message with no id, no body, a task name that is not
a string, a time limit that is not a number...), handling it raises in
the worker's event loop and the worker exits; kombu then restores the
message for the next worker, which exits too. Here any such error is caught
around the one message: the message is dead-lettered with the error as its
reason and rejected, and the worker takes the next one. Connection errors
still propagate, so Celery reconnects as usual and the message is restored.

Dead letters are kept in Keel's Redis whichever broker delivered the
message (``keel deadletters list``). On RabbitMQ the message is then
acknowledged or rejected without requeueing, as Celery does: it leaves the
queue instead of coming back forever. If Redis cannot take the letter
either, the message is logged in full, at error level, before it goes.

Wired in ``tasks.celeryconfig`` (``worker_consumer``).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import redis
from celery.signals import task_rejected
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.utils.json import dumps

from tasks.platform import deadletters
from tasks.platform.broker import redis_client
from tasks.platform.celery_events import BatchedTaskEvents
from tasks.platform.deadletters import DeadLetter
from tasks.platform.transport import Channel, Poison, announce

log = logging.getLogger(__name__)


def dead_letter(message: Any, reason: str) -> None:
    """Keep ``message`` in its queue's dead letters (via Keel's channel, if it is one)."""
    channel = getattr(message, "channel", None)
    queue = (message.delivery_info or {}).get("routing_key") or "unknown"
    payload = getattr(message, "_raw", None)  # what kombu's Redis transport popped
    if isinstance(channel, Channel):
        raw = dumps(payload) if payload is not None else message.body
        channel.dead_letter(queue, queue, Poison(raw, reason, payload=payload))
        return
    headers = message.headers if isinstance(message.headers, dict) else None
    keep(queue, Poison(envelope(message), reason, payload={"headers": headers}))


def envelope(message: Any) -> str:
    """A message from another transport (RabbitMQ) in the shape kombu's Redis transport keeps."""
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
    try:
        text, encoding = body.decode("utf-8"), None
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    properties: dict[str, Any] = {
        key: value
        for key, value in (message.properties or {}).items()
        if isinstance(value, str | int | float | bool)
    }
    info = message.delivery_info or {}
    properties["delivery_info"] = {
        "exchange": info.get("exchange"),
        "routing_key": info.get("routing_key"),
    }
    if encoding:
        properties["body_encoding"] = encoding
    document = {
        "body": text,
        "content-type": message.content_type,
        "content-encoding": message.content_encoding,
        "headers": message.headers,
        "properties": properties,
    }
    return json.dumps(document, default=str)  # AMQP header values may be of any type


def keep(queue: str, poison: Poison) -> None:
    """Write a dead letter to Keel's Redis; log the message in full if Redis cannot take it."""
    letter = DeadLetter.of(queue, queue, poison.raw, poison.reason)
    try:
        pipe = redis_client().pipeline()
        deadletters.add(pipe, letter)
        pipe.execute()
    except redis.RedisError as exc:
        log.error(
            "could not keep dead letter of %s (%s; Redis: %s), lost: %r",
            queue,
            poison.reason,
            exc,
            letter.raw[:4096],
        )
        return
    announce(letter, poison.payload)


def seconds_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def header_problem(headers: Any) -> str | None:
    """A header Celery uses only later, outside any one message's handling (pool timers)."""
    if not isinstance(headers, dict):
        return None  # Celery itself rejects these
    limits = headers.get("timelimit")
    if limits is not None and not (
        isinstance(limits, list | tuple) and len(limits) == 2 and all(map(seconds_or_none, limits))
    ):
        return f"timelimit must be [soft, hard] seconds, not {limits!r}"
    return None


class Consumer(BatchedTaskEvents, CeleryConsumer):
    """Celery's consumer with each task message handled inside its own guard."""

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        handle = super().create_task_handler(*args, **kwargs)
        # kombu counts KeyError among the Redis transport's connection errors (a
        # stale poller fd); inside one message's handling it is a missing field.
        transient = tuple(e for e in self.connection_errors if not issubclass(KeyError, e))

        def on_task_received(message: Any) -> Any:
            try:
                problem = header_problem(message.headers)
                if problem is not None:
                    return self.set_aside(message, problem)
                return handle(message)
            except transient:
                raise
            except Exception as exc:
                log.exception("could not take a message as a task; dead-lettering it")
                return self.set_aside(message, f"not a task message Celery can take: {exc!r}")

        return on_task_received

    def set_aside(self, message: Any, reason: str) -> None:
        dead_letter(message, reason)
        if not message.acknowledged:
            message.reject_log_error(log, self.connection_errors)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """Celery logs a body it cannot deserialize and acks it: keep it first."""
        dead_letter(message, f"body not readable: {exc!r}")
        super().on_decode_error(message, exc)


@task_rejected.connect
def keep_rejected(sender: Any = None, message: Any = None, exc: Any = None, **kw: Any) -> None:
    """Celery rejects a readable message that is not a task message; keep it, do not delete it."""
    dead_letter(
        message, f"not a Celery task message: {exc!r}" if exc else "not a Celery task message"
    )
