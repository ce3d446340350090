"""``keel db upgrade`` beside running processes never waits on them holding another lock.

A rolling upgrade migrates while the previous release's beat and workers run
(``docs/operations/upgrading.md``). A beat's fire locks its scheduler's row
(``job_schedulers``), then inserts the fired job (``jobs``). A run of several
migrations in one transaction would hold ``jobs`` (an earlier step altered it)
while a later step waits for ``job_schedulers``: with a fire in between, each
waits for the other. The beat's two steps run on two connections, so nothing
ends that wait but Keel's 30 s deadline on the insert, and the previous release
then parked the scheduler for good. Each migration therefore commits on its own,
and a step only ever waits holding its own table's locks. The test takes the
fire's two locks on one connection, where Postgres sees the cycle and ends one
side at once: an upgrade in one transaction fails it.
"""

from __future__ import annotations

import threading

import psycopg
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import text

from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.platform.migrate import alembic_config
from tests.support.databases import fresh_database
from tests.support.stack import wait_for

BEFORE = "0019"  # 0020 alters jobs, then 0021 alters job_schedulers


def test_an_upgrade_through_jobs_then_job_schedulers_never_deadlocks_with_a_fire(stack):
    with fresh_database(template=None):
        command.upgrade(alembic_config(), BEFORE)
        conninfo = get_settings().database_url
        assert conninfo
        # Given a beat's fire in progress: its scheduler row locked (FOR UPDATE takes this
        # table lock), its job not inserted yet
        with psycopg.connect(conninfo.replace("+psycopg", "")) as fire:
            fire.execute("SET lock_timeout = '20s'")
            fire.execute("LOCK TABLE job_schedulers IN ROW SHARE MODE")
            # When the upgrade runs past jobs' migration to job_schedulers'
            failed: list[BaseException] = []

            def upgrade() -> None:
                try:
                    command.upgrade(alembic_config(), "head")
                except BaseException as exc:  # reported by the test
                    failed.append(exc)

            migrating = threading.Thread(target=upgrade)
            migrating.start()
            wait_for(lambda: waiting_for(fire, "job_schedulers"), timeout=60)
            # and the fire then inserts its job (the lock an INSERT takes)
            fire.execute("LOCK TABLE jobs IN ROW EXCLUSIVE MODE")
            fire.commit()
            # Then the fire went through and the upgrade finished: neither was ended
            migrating.join(timeout=60)
        assert not migrating.is_alive()
        assert failed == []
        with transaction() as session:
            head = session.execute(text("SELECT version_num FROM alembic_version")).scalar()
        assert head == ScriptDirectory.from_config(alembic_config()).get_current_head()


def waiting_for(observer: psycopg.Connection, table: str) -> bool:
    """Whether another session waits for a lock on ``table``."""
    row = observer.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
        (table,),
    ).fetchone()
    return bool(row and row[0])
