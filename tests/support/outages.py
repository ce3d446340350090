"""Outages of the embedded servers, for the chaos tests.

Redis is stopped and started on the same port (it keeps nothing: the test
stack runs it without persistence). Postgres gets a fast shutdown (clients
are cut off) and is started again on the same data directory and socket.

Every helper refuses (``pytest.skip``) when the suite runs against external
servers (``KEEL_TEST_DATABASE_URL`` / ``KEEL_TEST_REDIS_URL``): those are not
ours to stop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tasks.embedded import EmbeddedPostgres, EmbeddedRedis
from tests.support.stack import TestStack


def embedded_redis(stack: TestStack) -> EmbeddedRedis:
    found = [s for s in stack.servers if isinstance(s, EmbeddedRedis)]
    if not found:
        pytest.skip("Redis is external: the chaos tests only stop the embedded one")
    return found[0]


def embedded_postgres(stack: TestStack) -> EmbeddedPostgres:
    found = [s for s in stack.servers if isinstance(s, EmbeddedPostgres)]
    if not found:
        pytest.skip("Postgres is external: the chaos tests only stop the embedded one")
    return found[0]


def stop_redis(stack: TestStack) -> None:
    """Stop the embedded Redis; everything it held is gone."""
    embedded_redis(stack).stop()


def start_redis(stack: TestStack) -> None:
    """Start the embedded Redis again, empty, on the same port."""
    server = embedded_redis(stack)
    if server.process is None:
        server.start()


@contextmanager
def redis_down(stack: TestStack) -> Iterator[None]:
    """Redis is down inside the block, and up again (empty) after it, whatever happens."""
    stop_redis(stack)
    try:
        yield
    finally:
        start_redis(stack)


def stop_postgres(stack: TestStack) -> None:
    """Fast shutdown: clients are disconnected, new connections are refused."""
    embedded_postgres(stack).stop()


def start_postgres(stack: TestStack) -> None:
    """Start the cluster again (same data, same socket)."""
    server = embedded_postgres(stack)
    if server.process is None:
        server.start()


@contextmanager
def postgres_down(stack: TestStack) -> Iterator[None]:
    """Postgres is stopped inside the block, and running again after it, whatever happens."""
    stop_postgres(stack)
    try:
        yield
    finally:
        start_postgres(stack)
