"""Keel's Redis transport: kombu's, except that poison messages go to dead letters.

The private members of kombu's it overrides or calls are listed, and tested against the
installed kombu, in ``tasks.platform.kombu_members``.

Used when Celery's messages go through Redis (the default); on RabbitMQ
kombu decodes nothing before Celery's consumer does, and ``tasks.platform.consumer``
alone keeps what cannot be taken.

kombu's Redis channel pops an item from a queue's list and decodes it in the
same step. An item that is not JSON, or JSON that kombu cannot take as a
message, raises inside the worker's event loop: the worker exits, and the
item, already popped, is gone. This channel screens every item it pops
before kombu decodes it, where redis-py parses the reply (a response
callback on the channel's own clients: redis-py's extension point, no
patching). An item that fails is moved to its queue's dead-letter list
(``tasks.platform.deadletters``), logged and emitted as a ``dead-lettered`` event, and
the worker goes on. That covers every list kombu pops: BRPOP names all of a
queue's priority lists (``_q_for_pri``) and the reply says which one answered;
RPOP serves ``basic_get``.

Three more places read a message:
- a broadcast (pub/sub, e.g. Celery's remote control): kombu already drops
  one that is not JSON; one that is JSON but no message is dead-lettered;
- kombu's own copy of an unacked message, re-read when the visibility
  timeout restores it (``QoS.restore_by_tag``): an entry that cannot be
  decoded is moved aside instead of stopping every sweep;
- Celery's consumer, which reads what kombu delivered as a task message:
  ``tasks.platform.consumer`` dead-letters what it cannot take.

An acknowledgement that Redis does not answer (a frozen or lost server: the
command times out) still frees the consumer's prefetch slot (``QoS.ack``).
kombu frees it only after Redis answered, so three such acks — a worker's
prefetch — stopped its consumer for good: no BRPOP is sent while every slot
is held. A message sent without Keel has an unacked copy in Redis, which comes
back after the visibility timeout, where Keel's claim refuses it (its record has
moved on); a recorded job's ack never goes to Redis (``QoS``).

A message's delivery tag (the key of kombu's unacked copy) is this process's
random prefix and a count: unique as kombu's UUID per message is, at a tenth
of its cost, which a bulk add pays for every message.

A publish can also take other Redis commands along in its round trip
(``riding``): an add's ``waiting`` event goes out in the pipeline of its
message's LPUSH.

Wired in ``tasks.celeryconfig`` (``broker_transport``).
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.exceptions import ConnectionError as RedisConnectionError

from tasks.platform import deadletters
from tasks.platform.deadletters import DeadLetter
from tasks.platform.errors import ControlFlow
from tasks.platform.headers import KEEL_HEADER

log = logging.getLogger(__name__)
# kombu's unacked copies say which queue they came from only inside the part
# that could not be decoded: such an entry is filed under this name.
UNACKED = "unacked"


class Poison(ControlFlow):
    """A popped item kombu cannot take as a message (raised from a response callback)."""

    code = "poison_message"

    def __init__(
        self, raw: bytes | str, reason: str, key: bytes | str | None = None, payload: Any = None
    ) -> None:
        super().__init__(reason)
        self.raw, self.reason, self.key, self.payload = raw, reason, key, payload


def message_problem(channel: kombu_redis.Channel, payload: Any) -> str | None:
    """Why kombu and its Redis QoS could not take ``payload`` as a message; None if they can."""
    if not isinstance(payload, dict):
        return f"a JSON {type(payload).__name__}, not a message object"
    properties = payload.get("properties")
    if not isinstance(properties, dict) or not isinstance(properties.get("delivery_tag"), str):
        return "no properties.delivery_tag"
    info = properties.get("delivery_info")
    if not isinstance(info, dict) or not {"exchange", "routing_key"} <= info.keys():
        return "no properties.delivery_info with exchange and routing_key"
    try:
        channel.Message(payload, channel=channel)  # what kombu does next; no side effects
    except Exception as exc:
        return f"not a kombu message: {exc!r}"
    return None


def screen(channel: kombu_redis.Channel, raw: bytes | str, key: bytes | None = None) -> None:
    """Raise ``Poison`` unless kombu can decode ``raw`` (decoded as kombu does it)."""
    try:
        payload = loads(bytes_to_str(raw))
    except (ValueError, TypeError) as exc:
        raise Poison(raw, f"not JSON: {exc}", key) from None
    problem = message_problem(channel, payload)
    if problem is not None:
        raise Poison(raw, problem, key, payload)


def task_of(payload: Any) -> tuple[str, str | None]:
    """The job id and task name a payload claims, if it claims any (for the event)."""
    headers = payload.get("headers") if isinstance(payload, dict) else None
    if not isinstance(headers, dict):
        return "", None
    job_id, name = headers.get("id"), headers.get("task")
    return (job_id if isinstance(job_id, str) else ""), (name if isinstance(name, str) else None)


#: Commands (each adds itself to a pipeline) for this thread's next publish to take along.
_RIDERS: ContextVar[list[Callable[[Any], None]] | None] = ContextVar("keel_riders", default=None)


@contextmanager
def riding(command: Callable[[Any], None]) -> Iterator[Callable[[], bool]]:
    """In the block, the next publish through a Redis channel sends ``command(pipeline)``
    in its own pipeline, before its LPUSH: one round trip for both. Yields whether it went
    (not on RabbitMQ, nor when that publish failed: the caller then sends it itself)."""
    riders = [command]
    token = _RIDERS.set(riders)
    try:
        yield lambda: not riders
    finally:
        _RIDERS.reset(token)


def recorded_job(message: Any) -> bool:
    """Whether ``message`` is one Keel sent for a job it recorded first, to be run as soon
    as it arrives: the job's record, not an unacked copy in Redis, is what brings it back
    if the worker dies. Not so for a task with Celery's ``rate_limit``, or in a worker
    that prefetches more than one message per process (``worker_prefetch_multiplier``):
    their messages wait in the worker's memory (for a token, for a busy process), where
    the reconciler would take them for lost and publish them again every round."""
    headers = getattr(message, "headers", None)
    if not isinstance(headers, dict) or not headers.get(KEEL_HEADER):
        return False
    from tasks.platform.celery_app import app  # set by then: kombu builds this transport for it

    if app.conf.worker_prefetch_multiplier != 1:
        return False

    task = app.tasks.get(headers.get("task"))
    return not getattr(task, "rate_limit", None)


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, with three changes.

    - **No unacked copy of a recorded job's message.** kombu keeps a copy of each delivered
      message in Redis until it is acknowledged (a ``MULTI``/``EXEC`` on delivery and
      another on the ack: eight of a no-op job's fifteen Redis commands), so that one whose
      worker died comes back after the visibility timeout. A recorded job does not need it:
      once its claim commits the message is spent (a killed run is found by its lock and
      requeued, ``tasks.jobs.upkeep``), and before that its record is waiting, so the
      reconciler publishes it again if no message is left (``tasks.jobs.upkeep.reconcile``,
      within grace + interval: 25 s). The prefetch slot is still held in memory until the
      ack, and a requeue or a warm shutdown puts the message back from memory. A message
      sent without Keel (recorded only on arrival), or of a task with Celery's
      ``rate_limit``, or taken by a worker that prefetches more than one message per
      process, keeps its copy (``recorded_job``).
    - An unacked copy it cannot decode is moved aside, not retried forever.
    - An ack or reject that Redis does not answer still frees its prefetch slot.
    """

    def append(self, message: Any, delivery_tag: Any) -> None:
        if recorded_job(message):  # the prefetch slot only, in memory
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)

    def _copyless(self, delivery_tag: Any) -> Any:
        """The delivered message of ``delivery_tag`` if it has no copy in Redis, else None."""
        delivered: dict[Any, Any] = self._delivered  # type: ignore[assignment]
        message = delivered.get(delivery_tag)
        return message if message is not None and recorded_job(message) else None

    def ack(self, delivery_tag: Any) -> None:
        try:
            if self._copyless(delivery_tag) is None:
                self._remove_from_indices(delivery_tag).execute()
        finally:
            # Freed whatever Redis said: a slot held for a message this worker is done with
            # never comes back, and with all of them held the consumer stops for good.
            virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            if requeue:
                self.restore_by_tag(delivery_tag, leftmost=True)
            elif self._copyless(delivery_tag) is None:
                self._remove_from_indices(delivery_tag).execute()
        finally:
            virtual.QoS.ack(self, delivery_tag)

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        message = self._copyless(tag)
        if message is not None:
            if tag not in (self._dirty or ()):  # acknowledged already: nothing to put back
                self._restore_from_memory(message, client, leftmost)
            return
        try:
            super().restore_by_tag(tag, client=client, leftmost=leftmost)
        except (ValueError, TypeError):  # kombu's decode of the entry it kept for ``tag``
            if not self.channel.dead_letter_unacked(tag):
                raise

    def _restore_from_memory(self, message: Any, client: Any, leftmost: bool) -> None:
        """Put a copyless message back on its queue, as kombu restores a kept copy."""
        info = message.delivery_info
        payload = copy.deepcopy(message._raw)
        with self.channel.conn_or_acquire(client) as connection:
            pipe = connection.pipeline()
            self.channel._do_restore_message(
                payload, info["exchange"], info["routing_key"], pipe, leftmost
            )
            pipe.execute()


class _Tags:
    """Delivery tags: a random prefix per process (a forked child draws its own) and a count."""

    def __init__(self) -> None:
        self.prefix = uuid.uuid4().hex
        self.count = itertools.count()  # next() on it is atomic under the GIL

    def next(self) -> str:
        return f"{self.prefix}.{next(self.count)}"


_tags = _Tags()


def _new_tags() -> None:
    global _tags
    _tags = _Tags()


os.register_at_fork(after_in_child=_new_tags)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with every popped item screened first."""

    QoS = QoS

    _shared: Any = None

    def _next_delivery_tag(self) -> str:
        return _tags.next()

    @property
    def pool(self) -> Any:
        """kombu's connection pool; once the connection is gone, a connection error.

        Celery's consumer, on a lost broker connection, first collects the connection
        (the channel's close can fail on the dead BRPOP socket, and the transport's client
        is cleared all the same), then closes it: that second close restores the unacked
        messages through a new pool built from the cleared client, an ``AttributeError``
        that kombu does not ignore, and the worker stopped ("Unrecoverable error") at a
        Redis restart. A connection error there is ignored, and the consumer reconnects
        (unacked copies come back after the visibility timeout; a recorded job's message,
        which has none, is published again from its record by the reconciler).
        """
        if self._pool is None and getattr(self.connection, "client", None) is None:
            raise RedisConnectionError("the broker connection is closed")
        return kombu_redis.Channel.pool.fget(self)  # type: ignore[attr-defined]

    def _create_client(self, asynchronous: bool = False) -> Any:
        client = super()._create_client(asynchronous=asynchronous)
        client.set_response_callback("BRPOP", self._screen_brpop)
        client.set_response_callback("RPOP", self._screen_rpop)
        return client

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """kombu builds a new client object for every publish and ack (a quarter of a
        millisecond each); one per channel and pool does the same work, since a client
        takes a connection from the pool per command. A new pool (after a fork, a
        reconnect) gets a new client: a child never uses its parent's sockets."""
        if client:
            yield client
            return
        pool = self.pool
        if self._shared is None or self._shared.connection_pool is not pool:
            self._shared = self._create_client()
        yield self._shared

    def _put(self, queue: Any, message: Any, **kwargs: Any) -> None:
        riders = _RIDERS.get()
        batch = kwargs.get("_publish_batch")
        if riders and batch is not None:  # kombu adds the LPUSH to the batch's pipeline next
            for ride in riders:
                ride(batch.pipeline)
            riders.clear()
        if not riders or batch is not None or queue in self._expires:
            super()._put(queue, message, **kwargs)
            return
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        with self.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            for ride in riders:
                ride(pipe)
            pipe.lpush(key, dumps(message))
            # A rider's error is its own (events are best effort); the LPUSH's is the publish's.
            pushed = pipe.execute(raise_on_error=False)[-1]
        riders.clear()
        if isinstance(pushed, Exception):
            raise pushed

    def _screen_brpop(self, response: Any, **options: Any) -> tuple | None:
        if not response:
            return None  # timed out
        key, item = response
        screen(self, item, key)
        return tuple(response)

    def _screen_rpop(self, response: Any, **options: Any) -> Any:
        if isinstance(response, (bytes, str)):
            screen(self, response)
        return response

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return super()._brpop_read(**options)
        except Poison as poison:
            source = bytes_to_str(poison.key)
            self.dead_letter(source.rsplit(self.sep, 1)[0], source, poison)
            raise Empty() from None  # nothing delivered: kombu issues the next BRPOP

    def _get(self, queue: Any, timeout: Any = None) -> Any:  # kombu's virtual signature
        while True:  # a poison item must not hide the message behind it
            try:
                return super()._get(queue)
            except Poison as poison:  # RPOP does not say which priority list answered
                self.dead_letter(queue, queue, poison)

    def _deliver_fanout_message(self, message: Any, exchange: str) -> bool:
        # Broadcasts (Celery's remote control) arrive by pub/sub: kombu drops one
        # that is not JSON, but one that is JSON and no message would raise.
        problem = message_problem(self, message)
        if problem is None:
            return super()._deliver_fanout_message(message, exchange)
        queue = self._fanout_to_queue.get(exchange, exchange)
        self.dead_letter(queue, exchange, Poison(dumps(message), problem, payload=message))
        return False

    def dead_letter(self, queue: str, source: str, poison: Poison) -> DeadLetter:
        """Keep ``poison`` in ``queue``'s dead letters, log it and emit ``dead-lettered``."""
        letter = DeadLetter.of(queue, source, poison.raw, poison.reason)
        try:
            with self.conn_or_acquire() as client:
                pipe = client.pipeline()
                deadletters.add(pipe, letter)
                pipe.execute()
        except self.connection_errors:
            log.error(
                "could not keep dead letter of %s (%s), lost: %r",
                queue,
                poison.reason,
                letter.raw[:2048],
            )
            raise
        announce(letter, poison.payload)
        return letter

    def dead_letter_unacked(self, tag: Any) -> bool:
        """Move kombu's unacked copy ``tag`` aside if it cannot be decoded; False if it can."""
        with self.conn_or_acquire() as client:
            raw = client.hget(self.unacked_key, tag)
            if raw is None:
                return True  # gone meanwhile: restored or acked elsewhere
            try:
                _payload, _exchange, _routing_key = loads(bytes_to_str(raw))  # as kombu reads it
                return False
            except (ValueError, TypeError) as exc:
                reason = f"unacked copy not readable: {exc!r}"
            letter = DeadLetter.of(UNACKED, self.unacked_key, raw, reason)
            pipe = client.pipeline()
            deadletters.add(pipe, letter)
            pipe.zrem(self.unacked_index_key, tag).hdel(self.unacked_key, tag)
            pipe.execute()
        announce(letter, None)
        return True


def announce(letter: DeadLetter, payload: Any) -> None:
    """Log a dead letter and send ``deadletters.dead_lettered`` (the job layer makes it an
    event on the queue's stream: ``tasks.jobs.observe.events.dead_letter_event``)."""
    job_id, name = task_of(payload)
    log.error(
        "dead-lettered an item of queue %s from %s (%s): %r; see `keel deadletters list`",
        letter.queue,
        letter.source,
        letter.reason,
        letter.raw[:512],
    )
    deadletters.dead_lettered.send(sender=letter, job_id=job_id, name=name)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with Keel's screening channel."""

    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """Keel's channel on the primary Redis Sentinel names (``KEEL_REDIS_URL=sentinel://…``).

    kombu's Sentinel channel builds its pools from ``master_for``: each new connection asks
    the sentinels for the primary, and a connection lost with it (the primary died) is
    replaced by one to whichever they name next, the promoted replica once they have
    failed over. The primary's name is the ``master_name`` transport option
    (``tasks.celeryconfig``), else the one in ``KEEL_REDIS_URL``: an app's own
    ``broker_transport_options`` without it still finds the primary.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from tasks.platform.config import get_settings

        self.master_name = get_settings().redis_target.master_name
        super().__init__(*args, **kwargs)  # a master_name transport option replaces it


class SentinelTransport(Transport, kombu_redis.SentinelTransport):
    """Keel's Redis transport through Redis Sentinel (``SentinelChannel``)."""

    Channel = SentinelChannel
    default_port = kombu_redis.SentinelTransport.default_port
