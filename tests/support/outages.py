"""Outages of the embedded servers, for the chaos tests.

Redis is stopped and started on the same port (it keeps nothing: the test
stack runs it without persistence). Postgres gets a fast shutdown (clients
are cut off) and is started again on the same data directory and socket.

Hangs (``postgres_hung``, ``redis_hung``) SIGSTOP the servers instead: their
sockets stay open and nothing answers.

Every helper refuses (``pytest.skip``) when the suite runs against external
servers (``KEEL_TEST_DATABASE_URL`` / ``KEEL_TEST_REDIS_URL``): those are not
ours to stop.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest

from keel.embedded import EmbeddedPostgres, EmbeddedRedis
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


def _signal_all(processes: list, sig: int) -> None:
    import psutil

    for process in processes:
        with suppress(psutil.NoSuchProcess):
            process.send_signal(sig)


@contextmanager
def postgres_hung(stack: TestStack) -> Iterator[None]:
    """Every process of the cluster is SIGSTOPped inside the block, and continued after it.

    Unlike a stop, nothing is closed: connections stay open and new ones are
    accepted by the kernel, but nothing is ever answered — what a stalled
    disk, a frozen VM or a half-open network path looks like to a client.
    """
    import psutil

    pid = embedded_postgres(stack).pid
    assert pid is not None, "the embedded Postgres is not running"
    postmaster = psutil.Process(pid)
    postmaster.send_signal(signal.SIGSTOP)  # first, so that it forks no new backend
    processes = [postmaster, *postmaster.children(recursive=True)]
    _signal_all(processes[1:], signal.SIGSTOP)
    try:
        yield
    finally:
        _signal_all(processes, signal.SIGCONT)


@contextmanager
def redis_hung(stack: TestStack) -> Iterator[None]:
    """The embedded Redis is SIGSTOPped inside the block (sockets open, no answers)."""
    process = embedded_redis(stack).process
    assert process is not None, "the embedded Redis is not running"
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)
