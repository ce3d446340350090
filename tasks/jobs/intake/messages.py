"""A waiting job's message: Celery's task message, built once and published lean.

Every Keel job is woken by a Celery task message (protocol 2, as Celery's own
``app.amqp.as_task_v2`` builds it: ``_built``), so a plain Celery worker, Flower and
``celery inspect`` read it as any other task. It is published through a kombu
producer directly rather than ``app.send_task``: a Keel job names its queue
(no router to consult), its publish retry policy is Keel's (``tasks.platform.broker``),
and ``send_task``'s per-call routing, option merging and queue declaration
cost several times what building and writing the message does (a batch of
10,000: ~2,500 messages/s through ``send_task``, ~15,000/s this way). On Redis,
a batch skips the producer's per-message ``publish`` too: its messages and
their ``task-sent`` events go in one pipeline, each written by the channel as
the producer would write it (``publish_all``, ``tasks.platform.pipelined``). What a
Celery user hooks into still happens: ``before_task_publish`` and
``after_task_publish`` fire for each message, and Flower gets a ``task-sent``
event for each (one ``task.multi`` message per batch, which Celery's event
receiver unpacks; a task declaring ``send_events = False`` keeps out of it).

The ``keel`` header marks the message as a wake-up for a record (a delivery
without one comes from plain Celery and is recorded on arrival:
``tasks.jobs.run.delivery``).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

from celery import signals
from celery.app.amqp import AMQP, task_message
from celery.events.dispatcher import EventDispatcher
from celery.events.event import get_exchange
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from celery.utils.time import utcoffset
from kombu.utils import json

from tasks.jobs.intake import tenancy
from tasks.jobs.model import formats, registry
from tasks.jobs.model.formats import KEEL_HEADER
from tasks.platform import broker, tracing
from tasks.platform.celery_app import app
from tasks.platform.config import get_settings
from tasks.platform.holding import Held
from tasks.platform.pipelined import Pipelined, pipelined

log = logging.getLogger(__name__)
# The job's tenant, whose keys its key limits are (``tasks.jobs.run.key_limits``), and the
# concurrency key its call gave (``concurrencyKey``): read when it is delivered, not from its
# record. Only Keel sets them; a call's ``headers=`` cannot.
TENANT_HEADER = "keel_tenant"
KEY_HEADER = "keel_key"
# Where a job's record keeps its call's concurrency key among its messages' context.
CONCURRENCY_KEY = "concurrency_key"
PUBLISH_RETRY = {"max_retries": 0, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
SENT = "task-sent"
# ``Message(parent=...)`` not given: the running task, if any, is looked up (a batch looks
# it up once for all its messages).
_LOOK_UP: Any = object()


class Message:
    """One waiting job's task message, ready for a producer.

    ``ctx`` carries the Celery canvas context of the job (chord callback, group
    id and index, chain, link and link_error, parent and root ids, the call's
    time limits and headers), kept on
    its record, so a job that is retried through the delayed set, promoted or
    republished still counts toward its chord and still triggers its children
    when it finally ends.

    The message asks for no result (``ignore_result``): results live in the job
    records, so nothing subscribes to a result channel. Chord parts still count:
    the worker reports them whatever this flag says.

    ``priority`` places the message among the queue's priority lists (0 first;
    see ``tasks.jobs.intake.tenancy`` for how a tenant's load on the queue sets it,
    and for what RabbitMQ makes of it). A control job (``handler(control=True)``)
    goes first whatever it is given: every way a job is published (add, bulk add,
    promotion, a canvas's wake-up, a republish) builds its message here.
    """

    __slots__ = ("body", "headers", "name", "plain", "properties", "queue", "sent", "trace")

    def __init__(
        self,
        job_id: str,
        name: str,
        queue: str,
        data: dict[str, Any],
        ctx: dict[str, Any] | None = None,
        *,
        priority: int = 0,
        parent: Any = _LOOK_UP,
        tenant: str | None = None,
    ) -> None:
        ctx = ctx or {}
        root_id, parent_id = ctx.get("root_id"), ctx.get("parent_id")
        if not root_id or not parent_id:  # as ``send_task`` does, inside a running task
            if parent is _LOOK_UP:
                parent = app.current_worker_task
            if parent is not None:
                root_id = root_id or parent.request.root_id or parent.request.id
                parent_id = parent_id or parent.request.id
        settings = _settings()
        argsrepr, kwargsrepr = shown_arguments(name, data)
        hard, soft = ctx.get("timelimit") or (None, None)  # the call's, or its timeout option
        build = _as_task_v2(settings)
        message = build(
            job_id,
            name,
            (),
            data,
            group_id=ctx.get("group"),
            group_index=ctx.get("group_index"),
            chord=ctx.get("chord"),
            callbacks=ctx.get("link"),
            errbacks=ctx.get("link_error"),
            chain=ctx.get("chain"),
            time_limit=hard,
            soft_time_limit=soft,
            reply_to=app.thread_oid,
            create_sent_event=_sends_events(name, settings),
            root_id=root_id,
            parent_id=parent_id,
            origin=settings.origin,
            ignore_result=True,
            argsrepr=argsrepr,
            kwargsrepr=kwargsrepr,
        )
        message.headers[KEEL_HEADER] = str(formats.MESSAGE_FORMAT)
        for header, value in (ctx.get("headers") or {}).items():  # the call's ``headers=``
            message.headers.setdefault(header, value)
        for header, value in ((TENANT_HEADER, tenant), (KEY_HEADER, ctx.get(CONCURRENCY_KEY))):
            if value is not None:
                message.headers[header] = value
            else:
                message.headers.pop(header, None)
        if registry.is_control(name):
            priority = 0  # ahead of its queue's bulk jobs, whatever its party's load
        message.properties["priority"] = tenancy.broker_priority(priority)
        self.name, self.queue = name, queue
        self.headers, self.properties, self.body = message.headers, message.properties, message.body
        self.sent: dict[str, Any] | None = message.sent_event
        # the add's (``tasks.platform.tracing``)
        self.trace: dict[str, str] | None = ctx.get("trace")
        # Built here from what the job's record holds: plain JSON values
        # (``tasks.platform.pipelined``)
        self.plain = build is _built

    def alike(
        self, job_id: str, data: dict[str, Any], priority: int, root_id: str | None
    ) -> Message:
        """This message for another job of the same type, queue and tenant whose record has
        no context (``messages_for``): what ``Message`` would build for it, at under half the
        cost. ``root_id``: the running task's root it inherits, if any (else its own id). Only
        where this message is ``plain`` (``_built`` made it)."""
        headers = dict(self.headers)
        argsrepr, kwargsrepr = shown_arguments(self.name, data)
        root_id = root_id or job_id
        headers["id"], headers["root_id"] = job_id, root_id
        headers["argsrepr"], headers["kwargsrepr"] = argsrepr, kwargsrepr
        headers["timelimit"] = list(headers["timelimit"])
        headers["stamps"] = {}
        properties = dict(self.properties)
        properties["correlation_id"] = job_id
        if not registry.is_control(self.name):  # (a control job's stays 0)
            properties["priority"] = tenancy.broker_priority(priority)
        args, _, embed = self.body
        made = object.__new__(Message)
        made.name, made.queue, made.plain, made.trace = self.name, self.queue, True, None
        made.headers, made.properties, made.body = headers, properties, (args, data, dict(embed))
        made.sent = None
        if self.sent is not None:
            made.sent = {
                **self.sent,
                "uuid": job_id,
                "root_id": root_id,
                "args": argsrepr,
                "kwargs": kwargsrepr,
            }
        return made

    def publish(self, producer: Any) -> None:
        """Write the message through ``producer`` (no retry: ``tasks.platform.broker.publish``
        decides).

        ``retry`` with a policy of no retries is not the same as no ``retry``: without
        kombu's ``ensure``, a producer with no channel yet connects with the transport's
        own retry loop (seconds on a hung Redis), past any request's deadline.
        """
        # The anonymous exchange routes by queue name, as ``send_task`` does for a direct
        # queue. RabbitMQ needs the queue declared first (cached per channel); a Redis queue
        # is a list that its first message creates.
        settings = _settings()
        declare = [app.amqp.queues[self.queue]] if get_settings().broker_on_amqp else None
        with self._signalled(declare):
            producer.publish(
                self.body,
                exchange="",
                routing_key=self.queue,
                serializer=settings.serializer,
                compression=settings.compression,
                retry=True,  # kombu's ensure(): with no retries, fails at once on a dead connection
                retry_policy=PUBLISH_RETRY,
                delivery_mode=2,
                declare=declare,
                headers=self.headers,
                **self.properties,
            )

    def push(self, batch: Pipelined) -> None:
        """Add the message to ``batch`` (Redis), as ``publish`` would send it."""
        if _unheard():  # no receiver of the publish signals: nothing to send them to
            self._push(batch, plain=self.plain)
            return
        with self._signalled(None):  # what a receiver changes in them goes out
            self._push(batch, plain=False)  # as a receiver left it: kombu's encoder

    def _push(self, batch: Pipelined, *, plain: bool) -> None:
        settings = _settings()
        properties = dict(self.properties)
        priority = properties.pop("priority", 0)
        batch.publish(
            self.body,
            self.queue,
            headers=self.headers,
            properties=properties,
            serializer=settings.serializer,
            compression=settings.compression,
            priority=priority,
            plain=plain,
        )

    @contextmanager
    def _signalled(self, declare: list[Any] | None) -> Iterator[None]:
        """Celery's ``before_task_publish`` and ``after_task_publish`` around the publish."""
        # Published later than added (a delay, a retry, a park): in the trace of the add
        # (the context kept on the record, ``tasks.platform.tracing``), unless a run sends it.
        with tracing.restored(self.trace):
            signals.before_task_publish.send(
                sender=self.name,
                body=self.body,
                exchange="",
                routing_key=self.queue,
                declare=declare,
                headers=self.headers,
                properties=self.properties,
                retry_policy=None,
            )
            yield
            signals.after_task_publish.send(
                sender=self.name,
                body=self.body,
                exchange="",
                routing_key=self.queue,
                headers=self.headers,
            )


class Waking(Protocol):
    """What a job's message is built of (a ``ReadyJob``'s or a ``NewJob``'s fields)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def data(self) -> dict[str, Any]: ...
    @property
    def celery_ctx(self) -> dict[str, Any] | None: ...
    @property
    def tenant_id(self) -> str | None: ...


def unbuildable(job: Waking) -> str | None:
    """Why no message can be built from ``job``'s record, or ``None``: data that is not an
    object (an earlier release's ``add()`` took a list), or a context that is not the shape
    Keel writes (a record edited by hand). What ``Message`` would otherwise fail on."""
    data, ctx = job.data, job.celery_ctx
    if data and not isinstance(data, Mapping):
        return f"its data is not an object but {type(data).__name__}"
    if ctx is None:
        return None
    if not isinstance(ctx, Mapping):
        return f"its context is not an object but {type(ctx).__name__}"
    limits = ctx.get("timelimit")
    if limits and not (isinstance(limits, list | tuple) and len(limits) == 2):
        return f"its time limits are not a pair: {limits!r}"
    headers = ctx.get("headers")
    if headers and not isinstance(headers, Mapping):
        return f"its call's headers are not an object but {type(headers).__name__}"
    return None


def messages_for(
    jobs: Sequence[Waking],
    priority: Mapping[str, int],
    parent: Any,  # the running task, if any (``app.current_worker_task``)
    refused: dict[str, str] | None = None,
) -> list[Message]:
    """The messages of a batch of jobs: each built by ``Message``, except that a job with
    no context of its own, whose data is a dict, and whose type, queue and tenant an
    earlier such job of the batch shares, takes that job's message ``alike``.

    ``refused``: where a job whose record no message can be built from (``unbuildable``)
    goes, by its id with the reason, left out of the messages; without it, building its
    message raises. Any other error is raised."""
    made: list[Message] = []
    first: dict[tuple[str, str, str | None], Message] = {}
    # What a job with no context inherits from the running task (``parent``), as ``Message``
    root_id = (parent.request.root_id or parent.request.id) if parent is not None else None
    for job in jobs:
        if refused is not None and (reason := unbuildable(job)) is not None:
            refused[job.id] = reason
            continue
        at = priority.get(job.id, 0)
        alone = not job.celery_ctx and type(job.data) is dict
        shared = first.get((job.name, job.queue, job.tenant_id)) if alone else None
        if shared is not None:
            made.append(shared.alike(job.id, job.data, at, root_id))
            continue
        message = Message(
            job.id,
            job.name,
            job.queue,
            job.data,
            job.celery_ctx,
            priority=at,
            parent=parent,
            tenant=job.tenant_id,
        )
        if message.plain and alone:
            first.setdefault((job.name, job.queue, job.tenant_id), message)
        made.append(message)
    return made


def publish_all(producer: Any, messages: Sequence[Message]) -> bool:
    """Send ``messages`` and their ``task-sent`` events in one pipeline
    (``tasks.platform.pipelined``; one job's event: ``announce_later``):
    all, or, if the send fails, any part of them (the error is raised). False, sending
    nothing, where the producer's channel cannot take a pipeline (RabbitMQ)."""
    if get_settings().broker_on_amqp:  # decided before the channel: ``broker.publish`` opens it
        return False

    sent = [message.sent for message in messages if message.sent is not None]
    alone = len(sent) == 1 and len(messages) == 1 and get_settings().event_flush_s > 0
    one = sent[0] if alone else None  # a job added alone: its event waits for others

    def send() -> bool:
        with pipelined(producer) as batch:
            if batch is None:
                return False
            for message in messages:
                message.push(batch)
            if sent and one is None:
                _push_events(producer, batch, sent)
        if one is not None:  # once its message is sent
            announce_later(producer, one)
        return True

    # Under kombu's ensure, as a producer's publish is (``retry=True``): no retry, and the
    # policy in the connection's options too, which a channel not yet opened connects by
    # (without it, the transport's own retry loop: 3 s on a hung Redis, not 0.5).
    connection = producer.connection
    connection.transport_options.update(PUBLISH_RETRY)
    went: bool = connection.ensure(producer, send, **PUBLISH_RETRY)()
    return went


def _bounded(value: Any, limit: int) -> str:
    text = repr(value)
    return text if len(text) <= limit else saferepr(value, limit)  # Celery's bounded repr


def shown_arguments(name: str, data: dict[str, Any]) -> tuple[str, str]:
    """``argsrepr``/``kwargsrepr``: what Flower and the worker's log show of a job's call.

    The message body carries the job's data as its keyword arguments, whatever the
    task's style; a Celery-style task's data is ``{"args": [...], "kwargs": {...}}``, and
    shown as the call it was (``add.delay(2, 3)`` → ``(2, 3)`` and ``{}``).
    """
    settings = _settings()
    amqp = settings.amqp
    task = settings.tasks.get(name)
    if getattr(task, "job_style", None) == "celery" and set(data) == {"args", "kwargs"}:
        args, kwargs = data["args"] or (), data["kwargs"] or {}
        if isinstance(args, list | tuple) and isinstance(kwargs, Mapping):  # else shown whole
            args, kwargs = tuple(args), dict(kwargs)
            return _bounded(args, amqp.argsrepr_maxsize), _bounded(kwargs, amqp.kwargsrepr_maxsize)
    return "()", _bounded(data, amqp.kwargsrepr_maxsize)


def publish(message: Message, producer: Any = None) -> None:
    """Send one waiting job's ``message``, and (``announce_later``) its ``task-sent`` event."""
    sent = message.sent
    with app.producer_or_acquire(producer) as used:
        broker.publish(message.publish, used)
        if sent is not None:
            announce_later(used, sent)


def announce_later(producer: Any, sent: dict[str, Any]) -> None:
    """A job added on its own: its ``task-sent`` event waits up to ``KEEL_EVENT_FLUSH_S``
    for others of this process to go out with it, as one ``task.multi`` message (as a
    worker's task events do, ``tasks.platform.celery_events``): under load, one Redis
    ``PUBLISH`` for many adds instead of one each. 0, or a RabbitMQ broker: sent with the
    job's message (on RabbitMQ, a thread sending held events through the producer pool
    tripled how long 1,000 jobs took to finish after a node restart,
    ``tests/rabbitmq/test_outages.py``: 43.7 s before, 127.1 s with it)."""
    settings = get_settings()
    if settings.event_flush_s > 0 and not settings.broker_on_amqp:
        _sent_later.add(sent)
    else:
        announce(producer, [sent])


def _announce_held(sent: list[dict[str, Any]]) -> None:
    with app.producer_or_acquire() as producer:
        announce(producer, sent)


_sent_later: Held[dict[str, Any]] = Held(
    _announce_held, lambda: get_settings().event_flush_s, "keel-task-sent"
)


def announce(producer: Any, sent: list[dict[str, Any]]) -> None:
    """``send_events`` after the messages they announce went out (or into the producer's
    batch): a failure here loses Flower's ``task-sent`` events, not the jobs, so it is
    logged, not raised. In a Redis publish batch nothing is written yet; the batch's
    flush, which fails for messages and events alike, is what the caller sees."""
    try:
        broker.publish(lambda p: send_events(p, sent), producer)
    except Exception as exc:
        log.warning("task-sent events of %d jobs not sent: %r", len(sent), exc)


def _unheard() -> bool:
    """Whether nothing listens to Celery's ``before_task_publish`` and ``after_task_publish``
    (OpenTelemetry's instrumentation does, when tracing is on; the trace a record carries is
    restored for them alone)."""
    return not signals.before_task_publish.receivers and not signals.after_task_publish.receivers


def send_events(producer: Any, sent: list[dict[str, Any]]) -> None:
    """Publish ``task-sent`` events for Flower through ``producer``: one message for all."""
    dispatcher = _settings().dispatcher
    made, routing_key = _sent_events(dispatcher, sent)
    exchange = _events_exchange(producer, dispatcher.exchange.name)
    producer.publish(
        made,
        exchange=exchange.name,
        routing_key=routing_key,
        declare=[exchange],
        serializer=dispatcher.serializer,
        headers=dispatcher.headers,
        delivery_mode=dispatcher.delivery_mode,
        retry=False,
    )


def _push_events(producer: Any, batch: Pipelined, sent: list[dict[str, Any]]) -> None:
    """``send_events``, into ``batch``: what fails before the round trip loses Flower's
    events (logged, as ``announce`` does), not the jobs."""
    dispatcher = _settings().dispatcher
    try:
        made, routing_key = _sent_events(dispatcher, sent)
        exchange = _events_exchange(producer, dispatcher.exchange.name)
        producer.maybe_declare(exchange)  # once per channel, as the producer's publish does
    except Exception as exc:
        log.warning("task-sent events of %d jobs not sent: %r", len(sent), exc)
        return
    batch.publish(
        made,
        routing_key,
        exchange=exchange.name,
        headers=dict(dispatcher.headers),
        properties={},
        serializer=dispatcher.serializer,
        delivery_mode=dispatcher.delivery_mode,
        plain=True,  # Celery's event fields: text, numbers, None
    )


def _sent_events(dispatcher: EventDispatcher, sent: list[dict[str, Any]]) -> tuple[Any, str]:
    """The body and routing key of one event message for ``sent`` (Celery's ``task.multi``
    for several, which its event receiver unpacks)."""
    # Celery's ``Event(SENT, hostname=, utcoffset=, pid=, clock=, **fields)`` for each, with
    # what the batch shares looked up once (the UTC offset reads the local time).
    hostname, offset, pid, forward = (
        dispatcher.hostname,
        utcoffset(),
        dispatcher.pid,
        dispatcher.clock.forward,
    )
    made = []
    for fields in sent:
        event = {"hostname": hostname, "utcoffset": offset, "pid": pid, "clock": forward()}
        event.update(fields)
        event.setdefault("timestamp", time.time())
        event["type"] = SENT
        made.append(event)
    if len(made) == 1:
        return made[0], "task.sent"
    return made, "task.multi"


def _events_exchange(producer: Any, name: str) -> Any:
    """Celery's event exchange, bound to the producer's channel once per channel.

    Its type follows the broker (fanout on Redis, topic on RabbitMQ). Made and bound
    anew for every publish, it is copied three times (a tenth of a single add's publish).
    """
    channel = producer.channel
    bound = getattr(channel, "_keel_events_exchange", None)
    if bound is None or bound.name != name:
        bound = get_exchange(producer.connection, name=name).bind(channel)
        channel._keel_events_exchange = bound
    return bound


class _Settings(NamedTuple):
    """What every message of this process shares (Celery's settings are slow to look up)."""

    dispatcher: EventDispatcher  # Celery's event exchange name, serializer and clock
    origin: str  # the ``origin`` header ``send_task`` would write
    serializer: str
    compression: str | None
    send_sent_event: bool
    amqp: Any  # ``app.amqp`` and ``app.tasks``: each lookup of these takes a lock
    tasks: Any


_process_settings: _Settings | None = None


def _settings() -> _Settings:
    """This process's; a forked child makes its own (its pid is in ``origin`` and events)."""
    global _process_settings
    if _process_settings is None:
        conf = app.conf
        _process_settings = _Settings(
            app.events.Dispatcher(enabled=False),
            anon_nodename(),
            conf.task_serializer,
            conf.task_compression,
            bool(conf.task_send_sent_event),
            app.amqp,
            app.tasks,
        )
    return _process_settings


def _forget_settings() -> None:
    global _process_settings
    _process_settings = None


os.register_at_fork(after_in_child=_forget_settings)


def _built(
    task_id: str,
    name: str,
    args: Any = None,
    kwargs: Any = None,
    *,
    group_id: Any = None,
    group_index: Any = None,
    chord: Any = None,
    callbacks: Any = None,
    errbacks: Any = None,
    chain: Any = None,
    time_limit: Any = None,
    soft_time_limit: Any = None,
    reply_to: Any = None,
    create_sent_event: bool = False,
    root_id: Any = None,
    parent_id: Any = None,
    origin: Any = None,
    ignore_result: bool = False,
    argsrepr: str,
    kwargsrepr: str,
) -> Any:
    """Celery's ``AMQP.as_task_v2`` for the arguments ``Message`` gives it (no countdown,
    ETA, expiry, shadow, stamps or retries; its reprs given), at a third of its
    cost: the same message, checked against it once a process (``_as_task_v2``)."""
    args = args or ()
    kwargs = kwargs or {}
    if not isinstance(args, list | tuple):  # as Celery's
        raise TypeError("task args must be a list or tuple")
    if not isinstance(kwargs, Mapping):
        raise TypeError("task keyword arguments must be a mapping")
    root_id = root_id or task_id
    headers = {
        "lang": "py",
        "task": name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": group_id,
        "group_index": group_index,
        "retries": 0,
        "timelimit": [time_limit, soft_time_limit],
        "root_id": root_id,
        "parent_id": parent_id,
        "argsrepr": argsrepr,
        "kwargsrepr": kwargsrepr,
        "origin": origin or anon_nodename(),
        "ignore_result": ignore_result,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    sent = None
    if create_sent_event:
        sent = {
            "uuid": task_id,
            "root_id": root_id,
            "parent_id": parent_id,
            "name": name,
            "args": argsrepr,
            "kwargs": kwargsrepr,
            "retries": 0,
            "eta": None,
            "expires": None,
        }
    return task_message(
        headers=headers,
        properties={"correlation_id": task_id, "reply_to": reply_to or ""},
        body=(
            args,
            kwargs,
            {"callbacks": callbacks, "errbacks": errbacks, "chain": chain, "chord": chord},
        ),
        sent_event=sent,
    )


# Celery's own, as imported: an app's subclass or a patch of it after import is not it.
_CELERYS_AS_TASK_V2 = AMQP.as_task_v2
# By app.amqp: whether ``_built`` writes what its ``as_task_v2`` writes.
_BUILT_MATCHES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _as_task_v2(settings: _Settings) -> Any:
    """``_built`` where it writes what this app's ``as_task_v2`` writes, else that."""
    amqp = settings.amqp
    matches = _BUILT_MATCHES.get(amqp)
    if matches is None:
        probe: dict[str, Any] = {
            "group_id": "g",
            "group_index": 1,
            "chord": {"task": "c"},
            "callbacks": [{"task": "l"}],
            "errbacks": None,
            "chain": [{"task": "n"}],
            "time_limit": 30.0,
            "soft_time_limit": None,
            "reply_to": "r",
            "create_sent_event": True,
            "root_id": None,
            "parent_id": "p",
            "origin": "o@h",
            "ignore_result": True,
            "argsrepr": "()",
            "kwargsrepr": "{'n': 1}",
        }
        own = type(amqp).as_task_v2 is _CELERYS_AS_TASK_V2 and "as_task_v2" not in vars(amqp)
        # Compared as written (key order and types too), not as equal values.
        matches = own and json.dumps(tuple(_built("i", "t", (), {"n": 1}, **probe))) == json.dumps(
            tuple(amqp.as_task_v2("i", "t", (), {"n": 1}, **probe))
        )
        if not matches:
            log.info("Celery's as_task_v2 writes another message here: used for every message")
        _BUILT_MATCHES[amqp] = matches
    return _built if matches else amqp.as_task_v2


def _sends_events(name: str, settings: _Settings) -> bool:
    """Celery's ``task_send_sent_event``, unless the task declares ``send_events = False``."""
    task = settings.tasks.get(name)
    return settings.send_sent_event and not (task is not None and task.send_events is False)
