"""Many messages to Redis in one pipeline, each written as kombu writes it.

kombu's ``Producer.publish`` costs about a tenth of a millisecond a message
before any byte is sent: its retry wrapper (``Connection.ensure``), option
merging, declarations and batch bookkeeping run for every message. A batch of
Keel's messages (a bulk add, a promotion, an add's message with its events)
goes to one Redis channel and needs none of that per message. ``pipelined``
yields a ``Pipelined`` over one redis-py pipeline of Keel's Redis channel
(``tasks.platform.transport.Channel``); its ``publish`` serializes and compresses a body
as the producer would (kombu's serializer registry), then hands the message to
the channel's own ``prepare_message`` and ``_inplace_augment_message`` (which
encode the body and give it its delivery tag) and pushes it to the queue's
priority list the channel names, as the channel's ``basic_publish`` would, and a
message for a fanout exchange (Flower's events) to its pub/sub channels, as the
channel's ``_put_fanout`` would; a message for another exchange, for a queue with
an expiry, or with commands riding along goes through ``basic_publish`` itself.
Either way a message reads exactly as one the producer sent
(``tests/integration/test_pipelined.py``). Consecutive LPUSHes to one list go
as one multi-value LPUSH (Redis pushes the values in order: the list
reads as after one LPUSH each).

A message the caller says holds plain values only (``plain``: a Keel job's message
that no publish-signal receiver touched, Flower's ``task-sent`` events) is JSON written
by orjson, its body and the envelope the channel writes, at a tenth of the standard
encoder's cost; any other goes through kombu's encoder, as before. What orjson would not
write as kombu's encoder does (a subclass of ``str``, ``int``, ``dict`` or ``list``, a
datetime, a dataclass, an integer past 64 bits) goes to kombu's encoder even then,
whole. A UUID or a NaN would be written differently, and neither reaches a plain
message: a job's data and its call's headers were recorded before it is sent, as JSON
(a UUID is refused there, a NaN by Postgres's ``jsonb``), and Celery's own fields are
text and numbers. orjson writes no spaces and leaves non-ASCII text as UTF-8 where the
standard encoder escapes it: the same JSON to any reader.

Commands that ride along with the next publish (``tasks.platform.transport.riding``)
go first in the pipeline, as they do in kombu's publish batch; a rider's error is
its own (logged), as in ``tasks.platform.transport.Channel._put``. A round trip that fails,
or in which a message's command fails, raises ``RoundTripFailed``: any part of the
batch may have been written.

What it does not do: RabbitMQ (``pipelined`` yields ``None``, and the caller
publishes through kombu), nor a channel whose client retries
(``supports_batch_publish``: a retried pipeline could push twice).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from kombu.compression import compress
from kombu.entity import maybe_delivery_mode
from kombu.exceptions import EncodeError
from kombu.serialization import dumps, registry
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual.exchange import FanoutExchange
from kombu.utils import json

from tasks.platform.transport import _RIDERS, Channel

log = logging.getLogger(__name__)
#: Values per LPUSH command (a bigger list goes in several).
LPUSH_MAX = 500
#: Messages per round trip: the pipeline is sent each time it holds this many.
FLUSH_AT = 1000


class RoundTripFailed(Exception):
    """A pipeline's round trip failed (raised from its error): any part of it may have been
    written. ``started``: when the round trip began (``time.monotonic``), which tells a hung
    server from one that refused at once (``tasks.platform.broker.failed``)."""

    def __init__(self, started: float) -> None:
        super().__init__("a Redis pipeline of messages failed; any part of it may have gone out")
        self.started = started


class Pipelined:
    """One pipeline's messages: kombu's publish-batch interface (``add``) for the channel.

    ``riders``: how many commands the pipeline starts with that ride along
    (``tasks.platform.transport.riding``); their errors are theirs (logged), not the messages'."""

    def __init__(self, channel: Channel, pipeline: Any, riders: int = 0) -> None:
        self.channel, self.pipeline = channel, pipeline
        self._key: Any = None
        self._values: list[Any] = []
        self._buffered = 0
        self._riders = riders

    def publish(
        self,
        body: Any,
        routing_key: str,
        *,
        exchange: str = "",
        headers: dict[str, Any],
        properties: dict[str, Any],
        serializer: str,
        compression: str | None = None,
        delivery_mode: Any = 2,
        priority: int = 0,
        plain: bool = False,
    ) -> None:
        """Add one message, as ``Producer.publish`` with these arguments would send it.

        ``properties`` is the message's own from here on (the channel adds its delivery
        details to it)."""
        content_type, content_encoding, data = _serialized(body, serializer, plain)
        encoded = _json if plain else _JSON.encode
        if compression:
            data, headers["compression"] = compress(data, compression)
        properties["delivery_mode"] = maybe_delivery_mode(delivery_mode)
        channel = self.channel
        message = channel.prepare_message(
            data, priority, content_type, content_encoding, headers, properties
        )
        if exchange and _fanout(channel, exchange) and not _RIDERS.get():
            # kombu's ``_put_fanout`` into this batch, the message written by ``_json``
            channel._inplace_augment_message(message, exchange, routing_key)
            payload = encoded(message)
            for topic in channel._get_publish_topics(exchange, routing_key):
                self.add("publish", topic, payload)
        elif exchange or routing_key in channel._expires or _RIDERS.get():
            channel.basic_publish(message, exchange, routing_key, _publish_batch=self)
        else:  # a queue's list: what kombu's ``basic_publish`` and ``_put`` would add, at once
            channel._inplace_augment_message(message, exchange, routing_key)
            key = channel._q_for_pri(routing_key, channel._get_message_priority(message))
            self.add("lpush", key, encoded(message))
        self._buffered += 1
        if self._buffered >= FLUSH_AT:
            self.execute()

    def add(self, name: str, *args: Any) -> None:
        """A command the channel adds for the message being published (kombu's batch API)."""
        if name == "lpush" and len(args) == 2:
            key, value = args
            if key != self._key or len(self._values) >= LPUSH_MAX:
                self._push()
                self._key = key
            self._values.append(value)
            return
        self._push()
        getattr(self.pipeline, name)(*args)

    def _push(self) -> None:
        if self._values:
            self.pipeline.lpush(self._key, *self._values)
            self._values = []

    def execute(self) -> None:
        """Send what is buffered (one round trip); ``RoundTripFailed`` if it failed or a
        message's command did."""
        self._push()
        self._buffered = 0
        if not len(self.pipeline):
            return
        riders, self._riders = self._riders, 0
        started = time.monotonic()
        try:
            replies = self.pipeline.execute(raise_on_error=False)
        except Exception as exc:
            raise RoundTripFailed(started) from exc
        for reply in replies[:riders]:
            if isinstance(reply, Exception):
                log.warning("a command riding with a publish failed: %r", reply)
        failed = next((r for r in replies[riders:] if isinstance(r, Exception)), None)
        if failed is not None:
            raise RoundTripFailed(started) from failed


# kombu's JSON encoder (``kombu.utils.json.dumps`` builds one per call), for what orjson
# leaves to it.
_JSON = json.JSONEncoder()
_KOMBU_JSON = ("application/json", "utf-8", json.dumps)  # the registry's entry, as kombu sets it
# What the standard encoder would write differently or hand to kombu's ``default`` goes to
# ``_leave``, which hands the whole value to kombu's encoder.
_PLAIN_ONLY = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


class _NotPlain(TypeError):
    pass


def _leave(value: Any) -> Any:
    raise _NotPlain(type(value).__name__)


def _json(value: Any) -> bytes | str:
    """``value`` as kombu's JSON encoder writes it (see the module's doc)."""
    try:
        return orjson.dumps(value, default=_leave, option=_PLAIN_ONLY)
    except TypeError:  # orjson.JSONEncodeError is one: not plain values, or a big int
        return _JSON.encode(value)


def _fanout(channel: Channel, exchange: str) -> bool:
    """Whether ``exchange`` is a fanout that kombu's Redis channel delivers itself."""
    kind = channel.typeof(exchange)
    return bool(
        channel.supports_fanout
        and type(kind).deliver is FanoutExchange.deliver
        and type(channel)._put_fanout is kombu_redis.Channel._put_fanout
    )


def _serialized(body: Any, serializer: str, plain: bool = False) -> tuple[str, str, str]:
    """``kombu.serialization.dumps(body, serializer)``, a third of its cost for kombu's
    json (a tenth for ``plain`` values, see the module's doc)."""
    if serializer == "json" and registry._encoders.get("json") == _KOMBU_JSON:
        try:
            data = _json(body) if plain else _JSON.encode(body)
        except Exception as exc:  # as the registry reports it
            raise EncodeError(exc) from exc
        return "application/json", "utf-8", data if isinstance(data, str) else data.decode()
    content_type, content_encoding, data = dumps(body, serializer=serializer)
    return content_type, content_encoding, data


@contextmanager
def pipelined(producer: Any) -> Iterator[Pipelined | None]:
    """A ``Pipelined`` on ``producer``'s channel, sent when the block ends without error;
    ``None`` where the channel is not Keel's Redis channel or cannot take it (see above).

    Evaluate it inside the caller's ``Connection.ensure`` (as the producer's publish is),
    so a channel that is yet to connect fails at once instead of retrying."""
    channel = producer.channel
    if not isinstance(channel, Channel) or not channel.supports_batch_publish:
        yield None
        return
    with channel.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
        riders = _RIDERS.get()
        if riders:  # first, as in kombu's publish batch (``Channel._put``)
            for ride in riders:
                ride(pipe)
            riders.clear()
        batch = Pipelined(channel, pipe, riders=len(pipe))
        yield batch
        batch.execute()
