"""Schema migrations: Alembic ``upgrade head`` from wherever Keel is installed.

The Alembic environment and versions live in the repository's ``migrations/``
folder and install as the package ``tasks.migrations`` (setup.py maps the one to
the other; ``script.py.mako`` and ``versions/`` ship as its package data). They
are found here through importlib.resources, so ``keel db upgrade`` works the same
from an editable install of a checkout or from a wheel. ``alembic.ini`` at the
repository root serves the plain ``alembic`` command in a checkout; this path
needs nothing from it but the script location, which it sets itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources

from alembic import command
from alembic.config import Config

MIGRATIONS_PACKAGE = "tasks.migrations"  # the repository's migrations/ (setup.py)


def script_location() -> str:
    """The migrations' folder (wheels install unzipped: a real folder Alembic can list)."""
    return str(resources.files(MIGRATIONS_PACKAGE))


def alembic_config() -> Config:
    """Alembic's configuration for Keel's schema; the URL comes from Keel's settings (env.py)."""
    config = Config()
    config.set_main_option("script_location", script_location())
    config.set_main_option("path_separator", "os")
    # The caller (keel, the supervisor, a test) owns logging; env.py must not reset it.
    config.attributes["configure_logger"] = False
    return config


def migrate() -> None:
    """Alembic upgrade head against the configured database."""
    command.upgrade(alembic_config(), "head")


@dataclass(frozen=True)
class SchemaState:
    """Where the database's schema stands against this release's migrations."""

    current: frozenset[str]  # its revisions (none: never migrated)
    heads: frozenset[str]  # this release's last revisions
    known: bool  # whether this release knows every revision of the database's

    @property
    def ready(self) -> bool:
        """At this release's head, or past it (a later release migrated: expand-then-contract
        keeps this release running on it, as it keeps the previous one, docs/operations/
        upgrading.md)."""
        return bool(self.current) and (self.current <= self.heads or not self.known)

    def said(self) -> str:
        at = ", ".join(sorted(self.current)) or "no revision (never migrated)"
        if not self.ready:
            return f"the database's schema is at {at}; this release needs {self._heads()}"
        if self.current <= self.heads:
            return "database at head"
        return f"database ahead of this release (at {at}; this release's head: {self._heads()})"

    def _heads(self) -> str:
        return ", ".join(sorted(self.heads))


def schema_state() -> SchemaState:
    """The database's Alembic revisions (in ``KEEL_DATABASE_SCHEMA``), against this
    release's."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from tasks.platform.config import get_settings
    from tasks.platform.db import engine

    script = ScriptDirectory.from_config(alembic_config())
    schema = get_settings().database_schema
    opts = {} if schema == "public" else {"version_table_schema": schema}
    with engine().connect() as connection:
        current = frozenset(MigrationContext.configure(connection, opts=opts).get_current_heads())
    known = {revision.revision for revision in script.walk_revisions()}
    return SchemaState(current, frozenset(script.get_heads()), current <= known)


def wait_for_schema(timeout_s: float, every_s: float = 2.0) -> SchemaState:
    """``schema_state()`` once it is ``ready``; the last one read at ``timeout_s`` otherwise.
    A database that does not answer is asked again, as one not migrated yet is."""
    from tasks.platform.db import STORE_UNAVAILABLE

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = schema_state()
            if state.ready or time.monotonic() >= deadline:
                return state
        except STORE_UNAVAILABLE:
            if time.monotonic() >= deadline:
                raise
        time.sleep(every_s)
