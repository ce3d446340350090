"""A session Postgres ends for a transaction left idle (25P03) is a lost connection to
Keel: one of the store errors a worker gives its delivery back for and the API answers
503 for, never a job's failure; the pool's next connection is a new one (real Postgres)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from tasks.platform import db
from tasks.platform.db import STORE_UNAVAILABLE, passing, transaction

pytestmark = pytest.mark.usefixtures("stack")


def test_a_session_ended_for_its_idle_transaction_is_a_lost_connection(monkeypatch):
    # Given Keel's idle-in-transaction timeout shortened to 1 s for new connections
    monkeypatch.setattr(db, "IDLE_IN_TRANSACTION_S", 1.0)
    db.dispose()
    try:
        # When a transaction says nothing for longer than that, then speaks again
        with pytest.raises(STORE_UNAVAILABLE) as ended, transaction() as session:
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar()
            time.sleep(2.5)
            session.execute(text("SELECT 1"))
        # Then the error is Postgres's own, raised as a store that is away for now
        assert ended.value.orig.sqlstate == "25P03", ended.value
        assert passing(ended.value)
        assert ended.value.connection_invalidated
        # and the next transaction runs, on a new server session
        with transaction() as session:
            assert session.execute(text("SELECT pg_backend_pid()")).scalar() != pid
    finally:
        db.dispose()  # the next tests' connections get the production timeout again
