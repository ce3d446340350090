"""Keel's RabbitMQ transport: kombu's py-amqp one, with every publisher confirm bounded.

With publisher confirms on (``confirm_publish``), a publish waits for the
broker's ack, and py-amqp waits without limit unless the caller passes a
timeout. Keel passes none for the messages Celery sends by itself — the
``task-sent`` event after each job's message, a chain's next step, a worker's
events — so a RabbitMQ that hangs (stopped process, full disk, memory alarm)
would hold an API request forever. Here every confirm waits at most
``CONFIRM_TIMEOUT_S``.

A confirm that timed out leaves the connection unusable: its ack may still
arrive and would then be taken for the next message's. The connection is
dropped at once (no network I/O: the broker is not answering) and kombu opens
a new one for the next publish.

Wired in ``tasks.celeryconfig`` (``broker_transport``) when ``KEEL_BROKER_URL``
is an AMQP URL.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import pyamqp

log = logging.getLogger(__name__)

# RabbitMQ confirms a quorum-queue publish once a majority has it on disk: a few
# milliseconds. Half a second without an answer means the broker is hung, and
# leaves an API request time to park the job instead (its database work has
# one second in all: ``KEEL_REQUEST_DEADLINE_S``).
CONFIRM_TIMEOUT_S = 0.5


class Channel(pyamqp.Channel):
    """kombu's AMQP channel; a publish waits at most ``CONFIRM_TIMEOUT_S`` for its confirm."""

    def basic_publish_confirm(self, *args: Any, **kwargs: Any) -> Any:
        for name in ("timeout", "confirm_timeout"):  # kombu passes both, usually None
            if kwargs.get(name) is None:
                kwargs[name] = CONFIRM_TIMEOUT_S
        try:
            return super().basic_publish_confirm(*args, **kwargs)
        except TimeoutError:  # socket.timeout
            log.warning("RabbitMQ did not confirm a publish within %.1f s", CONFIRM_TIMEOUT_S)
            self.connection.collect()  # a late ack must not confirm the next message
            raise


class Connection(pyamqp.Connection):
    Channel = Channel


class Transport(pyamqp.Transport):
    """kombu's py-amqp transport with bounded confirms."""

    Connection = Connection


class SSLTransport(Transport):
    """The same over TLS (``amqps://``), as kombu's ``pyamqp.SSLTransport``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        client: Any = self.client
        if not client.ssl:  # ``broker_use_ssl`` may have given options already
            client.ssl = True
