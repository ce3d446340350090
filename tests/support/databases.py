"""A fresh database per test module, copied from a migrated template.

The template (``keel_template``) is migrated once per session; a module's
database is ``CREATE DATABASE ... TEMPLATE keel_template``, a file copy that
takes a fraction of a second. The module then sees only its own rows: no
counts, retention or quota left behind by another module.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tasks.platform import db
from tasks.platform.config import get_settings, reload_settings, sqlalchemy_url
from tasks.platform.db import transaction
from tasks.platform.migrate import migrate

TEMPLATE = "keel_template"


def _named(url: str, database: str) -> str:
    return (
        make_url(sqlalchemy_url(url)).set(database=database).render_as_string(hide_password=False)
    )


def _admin(url: str, *statements: str) -> None:
    """Run statements outside a transaction (CREATE/DROP DATABASE) on the server of ``url``."""
    engine = create_engine(_named(url, "postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


@contextmanager
def using(url: str) -> Iterator[None]:
    """This process's settings and engines point at ``url`` inside the block."""
    previous = os.environ["KEEL_DATABASE_URL"]
    with db._lock:
        os.environ["KEEL_DATABASE_URL"] = url
        reload_settings()
        db.dispose()
    try:
        yield
    finally:
        # Under the lock engines are made under (``tasks.platform.db._scope``): no other thread of
        # this process (the inline worker's maintenance) can make one from the block's
        # settings while they change back, or keep one it made inside the block.
        with db._lock:
            os.environ["KEEL_DATABASE_URL"] = previous
            reload_settings()
            db.dispose()


def make_template() -> None:
    """Create and migrate ``keel_template`` from scratch (once per session)."""
    session_url = get_settings().database_url
    assert session_url
    _admin(session_url, f"DROP DATABASE IF EXISTS {TEMPLATE}", f"CREATE DATABASE {TEMPLATE}")
    with using(_named(session_url, TEMPLATE)):
        migrate()


@contextmanager
def fresh_database(template: str | None = TEMPLATE) -> Iterator[str]:
    """A new database copied from the template (``None``: an empty one, no migration run),
    used by this process inside the block."""
    session_url = get_settings().database_url
    assert session_url
    name = f"keel_module_{uuid.uuid4().hex[:12]}"
    _admin(session_url, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        with using(_named(session_url, name)):
            yield name
    finally:
        _admin(session_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def jobs_failing_once(id_prefix: str, sqlstate: str, on: str = "INSERT", times: int = 1):
    """The next insert (``on``: or ``UPDATE``, ``DELETE``) of a job whose id starts with
    ``id_prefix`` fails with ``sqlstate`` (the next ``times`` of them), as Postgres reports a
    deadlock or a timeout (a trigger; its count is a sequence, which the failed statement's
    rollback does not undo)."""
    row = "OLD" if on == "DELETE" else "NEW"
    name = f"fail_once_{uuid.uuid4().hex[:10]}"
    escaped = id_prefix.replace(":", r"\:")  # text() reads ":name" as a parameter
    with transaction() as session:
        session.execute(text(f"CREATE SEQUENCE {name}"))
        session.execute(
            text(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF nextval('{name}') <= {int(times)} THEN "
                f"RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END IF; "
                f"RETURN {row}; END $$"
            )
        )
        session.execute(
            text(
                f"CREATE TRIGGER {name} BEFORE {on} ON jobs FOR EACH ROW "
                f"WHEN ({row}.id LIKE '{escaped}%') EXECUTE FUNCTION {name}()"
            )
        )
    try:
        yield
    finally:
        with transaction() as session:
            session.execute(text(f"DROP TRIGGER {name} ON jobs"))
            session.execute(text(f"DROP FUNCTION {name}()"))
            session.execute(text(f"DROP SEQUENCE {name}"))
