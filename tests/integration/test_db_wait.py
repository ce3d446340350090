"""``keel db wait``: a process that must not start on an older schema waits for it.

Real ``keel`` processes on fresh databases of the suite's Postgres: one never migrated, one
at this release's head, one a later release migrated past it (a revision this release does
not know), and one migrated while the command waits.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from sqlalchemy import text

from tasks.platform.db import transaction
from tasks.platform.migrate import migrate, schema_state
from tests.support.databases import fresh_database
from tests.support.keel_up import KEEL

pytestmark = pytest.mark.usefixtures("stack")


def keel_db_wait(*args: str, timeout: float = 60) -> subprocess.Popen:
    """``keel db wait ARGS`` on this process's database (``fresh_database`` sets it)."""
    return subprocess.Popen(
        [KEEL, "db", "wait", *args],
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ended(process: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def test_a_schema_at_head_is_said_at_once():
    with fresh_database():
        code, out, err = ended(keel_db_wait("--timeout", "0"))
    assert (code, out, err) == (0, "database at head\n", "")


def test_a_schema_never_migrated_is_waited_for_then_refused_in_one_line():
    with fresh_database(template=None):
        started = time.monotonic()
        code, out, err = ended(keel_db_wait("--timeout", "3"))
        waited = time.monotonic() - started
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "never migrated" in err and "waited 3 s" in err, err
    assert waited >= 3, waited


def test_the_wait_ends_once_the_schema_is_migrated():
    with fresh_database(template=None):
        waiting = keel_db_wait("--timeout", "120")
        time.sleep(3)
        assert waiting.poll() is None  # still waiting: nothing migrated yet
        migrate()
        code, out, err = ended(waiting)
    assert (code, out, err) == (0, "database at head\n", "")


def test_a_schema_a_later_release_migrated_is_ready():
    with fresh_database():
        heads = schema_state().heads
        with transaction() as session:
            session.execute(text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
        state = schema_state()
        code, out, err = ended(keel_db_wait("--timeout", "0"))
    assert state.ready and not state.known and state.heads == heads
    assert code == 0 and err == "", err
    assert out.startswith("database ahead of this release (at ffffffffffff"), out


def test_a_schema_an_earlier_release_left_is_not_ready():
    from alembic.script import ScriptDirectory

    from tasks.platform.migrate import alembic_config

    first = list(ScriptDirectory.from_config(alembic_config()).walk_revisions())[-1].revision
    with fresh_database():
        with transaction() as session:
            session.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": first})
        state = schema_state()
        code, _out, err = ended(keel_db_wait("--timeout", "0"))
    assert state.known and not state.ready
    assert code == 1 and f"is at {first}; this release needs" in err, err
