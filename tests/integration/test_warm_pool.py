"""An API process opens its request pool before it serves (``tasks.platform.db.warm``).

Why: a fresh API process's first requests paid, inside their 1 s deadline, for
SQLAlchemy's first-connect checks and a new server process per connection. Eight
side by side on a fresh gunicorn under CPU load spent 0.2 to 0.4 s of that second
on it (0.01 to 0.09 s once warmed), and on a busier host one was answered 503. A
database that does not answer must not stop the process from serving: it warms
what it can and says so.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import event

from tasks.platform import db, deadline
from tests.support.databases import using

pytestmark = pytest.mark.usefixtures("stack")


def _request_pool():
    with db.request_scope():
        return db.engine().pool


def test_warm_opens_the_request_pool_and_the_first_requests_connect_no_more():
    # Given a process whose engines were just made afresh
    db.dispose()
    # When it warms
    opened = db.warm()
    # Then the request pool holds its connections, open and idle
    assert opened == db.POOL_SIZE
    pool = _request_pool()
    assert pool.checkedin() == db.POOL_SIZE, pool.status()
    # and as many requests side by side as it holds open no new connection
    connects: list[object] = []
    event.listen(pool, "connect", lambda *_: connects.append(1))
    with db.request_scope():
        made = db.engine()
        held = [made.connect() for _ in range(db.POOL_SIZE)]
        for connection in held:
            assert connection.exec_driver_sql("SELECT 1").scalar() == 1
        for connection in held:
            connection.close()
    assert connects == []


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A listener that accepts connections and never answers: a hung Postgres."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


def test_warm_against_a_hung_database_gives_up_at_its_deadline_and_says_so(silent_server, caplog):
    # Given a database that accepts connections and never answers
    with using(f"postgresql+psycopg://keel@127.0.0.1:{silent_server}/keel"):
        # When a process warms with 0.5 s to do it
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="tasks.platform.db"):
            opened = db.warm(0.5)
        took = time.monotonic() - started
    # Then it opened nothing, did not raise, and gave up at its deadline, not libpq's 2 s
    assert opened == 0
    assert 0.4 <= took < 1.5, took
    [record] = [r for r in caplog.records if r.name == "tasks.platform.db"]
    assert "opened 0 connections of 5" in record.getMessage()
    assert "did not answer in time" in record.getMessage()
    assert deadline.budgeted() is False  # the process's own scope is left as it was
