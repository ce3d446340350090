"""A pooled connection the server closed is replaced at checkout, not failed on.

Keel sends no pre-ping (a ``SELECT 1`` per transaction on the hot path); the
pool checks an idle connection by its socket instead (``tasks.platform.db.still_open``).
A server that ended the session (a restart, ``pg_terminate_backend``, an idle
timeout) has written its goodbye to that socket: the next transaction must
get a fresh connection and succeed, in both kinds of transaction.
"""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from tasks.platform import db
from tasks.platform.db import transaction
from tests.support.stack import wait_for

BACKEND = text("SELECT pg_backend_pid()")


def terminate(pid: int) -> None:
    """End a server session from a connection of its own (outside the pool), and wait until
    its backend is gone (its goodbye is then on the pooled connection's socket)."""
    url = db.engine().url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        gone = "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s)"
        wait_for(lambda: admin.execute(gone, (pid,)).fetchone()[0], timeout=10)


@pytest.mark.parametrize("one_statement", [False, True])
def test_a_connection_the_server_ended_is_replaced_at_checkout(stack, one_statement):
    db.dispose()  # a pool of one connection, the one about to be ended
    with transaction(one_statement=one_statement) as session:
        first = session.execute(BACKEND).scalar_one()
    assert db.engine().pool.checkedin() == 1

    terminate(first)

    with transaction(one_statement=one_statement) as session:
        second = session.execute(BACKEND).scalar_one()
    assert second != first
