"""A client-side deadline on every round trip to Postgres.

Why it is needed: a Postgres that hangs instead of going down (stopped
process, stalled disk, half-open network path) keeps its socket open. A new
connection is accepted by the kernel and then never answered, and a query
that was sent simply never gets a reply; ``statement_timeout`` is enforced
by that same hung server, and a liveness query (a pre-ping) would hang too, so
neither helps. Without a deadline of our own, an API request hangs until the
server comes back (or gunicorn kills the worker).

How: psycopg 3 drives libpq non-blocking from Python. Every operation —
connecting, a query, a commit — is a generator that the connection's
``wait`` resumes whenever the socket is ready, and at least every 0.1 s when
it is not. :class:`DeadlineConnection` wraps those generators (in ``wait``,
and in ``_connect_gen``, the class's own constructor of connections): once
the deadline has passed, the connection is closed (its protocol state is
unknown) and :class:`StoreTimeout` is raised. SQLAlchemy sees a closed
connection, so it treats the error as a disconnect and drops the connection
from its pool. ``tests/integration/test_store_deadline.py`` checks that
psycopg still resumes its generators this way.

Which deadline: inside ``budget(seconds)`` (one API request), all database
work shares one deadline that starts with the first database use, the wait
for a pooled connection included (a slow upload before it is not ours to
count). Time the request spends waiting on another server between two
database calls (``paused``: a publish to a hung Redis) is not database time
and does not count. Elsewhere (workers, beat, the CLI) each round trip gets
``BACKGROUND_S``: long enough that a worker simply waits out a short hang,
finite so that no delivery waits forever.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import psycopg

BACKGROUND_S = 30.0


class StoreTimeout(psycopg.OperationalError):
    """The job store did not answer before the deadline."""


@dataclass
class _Budget:
    seconds: float
    expires_at: float | None = None

    def expiry(self) -> float:
        if self.expires_at is None:  # the clock starts with the first database use
            self.expires_at = time.monotonic() + self.seconds
        return self.expires_at


_budget: ContextVar[_Budget | None] = ContextVar("keel_store_budget", default=None)


@contextmanager
def budget(seconds: float) -> Iterator[None]:
    """All database work inside the block shares one deadline of ``seconds``."""
    token = _budget.set(_Budget(seconds))
    try:
        yield
    finally:
        _budget.reset(token)


@contextmanager
def paused() -> Iterator[None]:
    """The budget's clock stands still inside the block: for a wait on another server.

    A request that publishes its job after recording it waits up to a Redis
    timeout when Redis hangs, then parks the job in Postgres. Counted, that
    wait left the park half the budget, and on a busy host none: the request
    was answered 503, blaming a database that had answered every query in
    milliseconds. Database work inside the block is not counted either: keep
    it out.
    """
    current = _budget.get()
    expires_at = current.expires_at if current is not None else None
    began = time.monotonic()
    try:
        yield
    finally:
        if current is not None and expires_at is not None:  # a clock not yet started stays so
            current.expires_at = expires_at + time.monotonic() - began


def budgeted() -> bool:
    """Whether the caller runs inside ``budget`` (an API request)."""
    return _budget.get() is not None


def start() -> None:
    """Start the budget's clock, if there is a budget and its clock has not started.

    Called before taking a connection from the pool, so that waiting for one
    counts toward the budget too.
    """
    current = _budget.get()
    if current is not None:
        current.expiry()


def expiry() -> float:
    """When the next round trip must be over (``time.monotonic()`` time)."""
    current = _budget.get()
    return current.expiry() if current is not None else time.monotonic() + BACKGROUND_S


def _bounded(
    gen: Generator[Any, Any, Any], expires_at: float, what: str
) -> Generator[Any, Any, Any]:
    """Drive psycopg's generator ``gen``; raise ``StoreTimeout`` once ``expires_at`` passes."""
    if time.monotonic() >= expires_at:  # nothing sent yet: do not start what cannot finish
        gen.close()
        raise StoreTimeout(f"no time left for the database ({what})")
    try:
        waiting = next(gen)
        while True:
            ready = yield waiting
            if time.monotonic() >= expires_at:
                gen.close()
                raise StoreTimeout(f"the database did not answer in time ({what})")
            waiting = gen.send(ready)
    except StopIteration as done:
        return done.value


class DeadlineConnection(psycopg.Connection):
    """A psycopg connection whose every wait ends at the current deadline."""

    @classmethod
    def _connect_gen(cls, conninfo: str = "") -> Generator[Any, Any, Any]:
        return _bounded(super()._connect_gen(conninfo), expiry(), "connect")

    def wait(self, gen: Generator[Any, Any, Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return super().wait(_bounded(gen, expiry(), "query"), *args, **kwargs)
        except StoreTimeout:
            self.close()  # mid-protocol: unusable; closed, SQLAlchemy discards it
            raise
