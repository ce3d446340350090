"""A broker connection that Celery's consumer has already collected closes quietly.

On a lost Redis, Celery's consumer collects the connection (the transport's
client is cleared even when the channel's close failed on the dead BRPOP
socket), then closes it: that close restores the unacked messages through the
channel's pool. Built from the cleared client, the pool raised
``AttributeError`` — not a connection error, so kombu did not ignore it and
the worker stopped for good at a Redis restart (the soak's never-killed
worker died in 3 of 5 three-minute runs). Keel's channel raises a connection
error instead, which kombu's close ignores.
"""

from __future__ import annotations

import pytest
from kombu import Connection
from kombu.common import ignore_errors
from redis.exceptions import ConnectionError as RedisConnectionError

from tasks.platform.config import get_settings
from tasks.platform.transport import Transport

pytestmark = pytest.mark.usefixtures("stack")


def collected_channel():
    """A channel of Keel's transport on the session's Redis, as Celery's collect() leaves it:
    no pool yet, and its connection's client cleared."""
    connection = Connection(get_settings().redis_url, transport=Transport)
    channel = connection.channel()
    channel._pool = None
    channel.connection.client = None
    return connection, channel


def test_a_collected_channels_pool_is_a_connection_error():
    _, channel = collected_channel()
    with pytest.raises(RedisConnectionError):
        channel.pool  # noqa: B018


def test_closing_a_collected_channel_with_unacked_messages_is_ignored_as_a_connection_error():
    # Celery's consumer closes the collected connection ignoring the transport's
    # connection errors (kombu's ignore_errors); an AttributeError went through
    connection, channel = collected_channel()
    channel.qos._delivered["tag-1"] = (b"{}", "default")  # an unacked message to restore
    ignore_errors(connection, channel.close)
