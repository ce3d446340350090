"""Every round trip to Postgres has a client-side deadline (``tasks.platform.deadline``).

Why: a hung Postgres keeps its sockets open, so neither its own
``statement_timeout`` nor a pre-ping ever ends the wait; only a deadline
kept by the client does. These tests meet the deadline with a real server
that is slow on purpose (``pg_sleep``) and with a listener that accepts a
connection and never says a word; the hung-server case end to end (SIGSTOP,
through gunicorn) is in ``tests/serving``.
"""

from __future__ import annotations

import socket
import time

import psycopg
import pytest
from sqlalchemy import text

from tasks.platform import db, deadline
from tasks.platform.db import STORE_UNAVAILABLE, transaction

pytestmark = pytest.mark.stack  # starts processes of its own


def timed(fn) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        fn()
    except Exception as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def sleep_in_database(seconds: float) -> None:
    with transaction() as session:
        session.execute(text("SELECT pg_sleep(:s)"), {"s": seconds})


def test_a_request_shares_one_deadline_across_its_round_trips(stack):
    # Given a request scope of 0.6 s, whose first statement takes 0.3 s
    def request() -> None:
        with db.request_scope(0.6):
            sleep_in_database(0.3)
            sleep_in_database(0.3)  # the budget runs out during this one
            sleep_in_database(0.3)  # never reached

    # When it runs, Then it fails with the deadline error once the budget is spent
    error, took = timed(request)
    assert isinstance(error, STORE_UNAVAILABLE), error
    assert isinstance(error.orig, deadline.StoreTimeout), error  # the client's deadline fired
    assert 0.55 <= took < 1.0, took
    # and the connection it broke was dropped: the next request is served normally
    with db.request_scope(), transaction() as session:
        assert session.execute(text("SELECT 1")).scalar() == 1


def test_the_request_engine_has_a_server_side_statement_timeout(stack):
    # Given a request scope longer than the request engine's statement_timeout
    with db.request_scope(5), transaction() as session:
        assert session.execute(text("SHOW statement_timeout")).scalar() == "1s"
    # When a statement runs longer, Then Postgres itself cancels it (the connection stays usable)
    error, took = timed(lambda: _long_request(5))
    assert isinstance(error, STORE_UNAVAILABLE), error
    assert isinstance(error.orig, psycopg.errors.QueryCanceled), error
    assert 0.9 <= took < 2.0, took


def _long_request(budget_s: float) -> None:
    with db.request_scope(budget_s):
        sleep_in_database(3)


def test_background_work_gets_a_deadline_per_round_trip(stack, monkeypatch):
    # Given background work (no request scope) with a short per-round-trip deadline
    monkeypatch.setattr(deadline, "BACKGROUND_S", 0.5)
    with transaction() as session:
        assert session.execute(text("SHOW statement_timeout")).scalar() == "0"
    # When a statement does not answer in time, Then the deadline error ends the wait
    error, took = timed(lambda: sleep_in_database(3))
    assert isinstance(error, STORE_UNAVAILABLE) and isinstance(error.orig, deadline.StoreTimeout)
    assert 0.45 <= took < 1.2, took


@pytest.fixture
def silent_server():
    """A listener that accepts connections and never answers: a hung server, to its clients."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


def test_connecting_to_a_server_that_never_answers_ends_at_the_deadline(silent_server):
    conninfo = f"host=127.0.0.1 port={silent_server} user=keel dbname=keel connect_timeout=10"

    def connect() -> None:
        with deadline.budget(0.4):
            deadline.DeadlineConnection.connect(conninfo)

    error, took = timed(connect)
    assert isinstance(error, deadline.StoreTimeout), error
    assert 0.35 <= took < 1.0, took  # not libpq's connect_timeout (10 s here, 2 s at least)
