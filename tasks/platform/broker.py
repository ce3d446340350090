"""One Redis client per process, and how long to trust Redis and the broker after a timeout.

Redis answers in well under a millisecond, so a reply that takes
``REDIS_TIMEOUT_S`` means Redis is hung. Once a call has waited that long
for nothing, the process treats Redis as unreachable for ``UNREACHABLE_S``:
events are dropped and new jobs are parked for the promoter instead of
published, so a hung Redis costs one timeout per process and period rather
than one per call — ``POST /reports`` keeps answering 202 at once. A refused
connection (Redis down, not hung) fails at once and costs nothing, so it
does not count.

Celery's messages go through that same Redis unless ``KEEL_BROKER_URL``
names RabbitMQ. Then publishing has its own account (``publish_unreachable``,
``publish_failed``): a hung RabbitMQ parks new jobs without silencing
events, and a hung Redis drops events without parking jobs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import redis

from tasks.platform.config import get_settings
from tasks.platform.rabbitmq import CONFIRM_TIMEOUT_S
from tasks.platform.redis_url import parse, tls_failure

log = logging.getLogger(__name__)

REDIS_TIMEOUT_S = 0.5
UNREACHABLE_S = 2.0
# What "Redis is down or did not answer" looks like to redis-py.
UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
# The longest a call waits for each server before it counts as hung.
TIMEOUTS_S = {"Redis": REDIS_TIMEOUT_S, "RabbitMQ": CONFIRM_TIMEOUT_S}

_state: dict[str, object] = {}
_unreachable_until = {"Redis": 0.0, "RabbitMQ": 0.0}


def new_client(url: str | None = None, **options: Any) -> redis.Redis:
    """A new client of Keel's Redis (``KEEL_REDIS_URL``, or ``url``), each connection with
    ``options``: one Redis, one over TLS, or the primary Redis Sentinel names
    (``tasks.platform.redis_url``). Every Redis client of Keel's is made here."""
    return parse(url or get_settings().redis).client(**options)


def redis_client() -> redis.Redis:
    if _state.get("pid") != os.getpid():
        _state["client"] = new_client(
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            health_check_interval=30,
        )
        _state["pid"] = os.getpid()
    return _state["client"]  # type: ignore[return-value]


def refuse_tls_failure(**_: Any) -> None:
    """At a worker's or beat's start: stop in one line if Keel's Redis refuses TLS.

    A certificate that does not verify (a wrong CA file, a host its certificate does
    not name) will not verify on the next try either: the process exits naming the
    URL's host and the TLS error, instead of retrying for ever. Any other failure (Redis
    not up yet) is left to the usual retries."""
    target = parse(get_settings().redis)
    if target.ssl is None:
        return
    client = target.client(socket_timeout=REDIS_TIMEOUT_S * 4, socket_connect_timeout=2.0)
    try:
        client.ping()
    except UNREACHABLE_ERRORS as exc:
        failure = tls_failure(exc)
        if failure is not None:
            ca = target.ssl.get("ssl_ca_certs", "the system's")
            raise SystemExit(
                f"keel: cannot connect to Redis at {target.host} over TLS (KEEL_REDIS_URL "
                f"{target.shown_without_query()}, CA file {ca}): {failure}"
            ) from None
    finally:
        client.close()


def unreachable(server: str = "Redis") -> bool:
    """Whether ``server`` failed to answer in this process within the last ``UNREACHABLE_S``."""
    return time.monotonic() < _unreachable_until[server]


def failed(exc: BaseException, started: float, server: str = "Redis") -> None:
    """A call to ``server`` begun at ``started`` (monotonic) failed with ``exc``.

    If it failed only after waiting for a timeout, skip that server for
    ``UNREACHABLE_S`` (logged once per period).
    """
    if time.monotonic() - started < TIMEOUTS_S[server] / 2:
        return
    if not unreachable(server):
        log.warning("%s is not answering (%s); skipping it for %.0f s", server, exc, UNREACHABLE_S)
    _unreachable_until[server] = time.monotonic() + UNREACHABLE_S


def message_broker() -> str:
    """The server that carries Celery's messages: ``"RabbitMQ"`` or ``"Redis"``."""
    return "RabbitMQ" if get_settings().broker_on_amqp else "Redis"


def publish_unreachable() -> bool:
    """Whether the message broker is known not to answer here: park, do not publish."""
    return unreachable(message_broker())


def publish_failed(exc: BaseException, started: float) -> None:
    """A publish begun at ``started`` failed with ``exc`` (see ``failed``)."""
    failed(exc, started, message_broker())


def publish(send: Callable[[Any], object], producer: Any = None) -> None:
    """Run ``send(producer)`` (one publish); on RabbitMQ, once more if it failed at once.

    A connection RabbitMQ closed (it restarted while this process was idle)
    fails the first publish on it at once; a second try on a new connection
    goes through: the given producer's connection is replaced in place (a
    batch goes on with it), or, with none given, kombu's pool opens one. A
    publish that failed after waiting is not tried again: the broker is hung,
    and a second wait would only double the caller's. Redis needs neither:
    redis-py reconnects by itself.
    """
    started = time.monotonic()
    try:
        send(producer)
    except Exception:
        server = message_broker()
        if server != "RabbitMQ" or time.monotonic() - started >= TIMEOUTS_S[server] / 2:
            raise
        log.info("publish failed at once; trying again on a new connection", exc_info=True)
        if producer is not None:
            connection = producer.connection
            connection.collect()  # no I/O: the old socket is gone or closing
            producer.revive(connection.default_channel)
        send(producer)
