"""Alembic environment: the URL comes from Keel's settings, the metadata from its models.

Keel's schema (``KEEL_DATABASE_SCHEMA``) is created if missing and is the migrations' only
search path: every table, function and trigger they make (all named unqualified) lands
there, and so does Alembic's version table. ``public`` (the default) changes nothing.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool, text

from tasks.models import metadata
from tasks.platform.config import get_settings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata
SCHEMA = get_settings().database_schema  # a plain identifier (checked by the settings)
IN_SCHEMA: dict = {} if SCHEMA == "public" else {"version_table_schema": SCHEMA}


def run_migrations_offline() -> None:
    context.configure(
        url=get_settings().sqlalchemy_url,
        target_metadata=target_metadata,
        literal_binds=True,
        compare_type=True,
        **IN_SCHEMA,
    )
    with context.begin_transaction():
        if IN_SCHEMA:
            context.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            context.execute(f"SET search_path TO {SCHEMA}")
        context.run_migrations()


def run_migrations_online() -> None:
    options = {"options": f"-c search_path={SCHEMA}"} if IN_SCHEMA else {}
    engine = create_engine(
        get_settings().sqlalchemy_url, poolclass=pool.NullPool, connect_args=options
    )
    with engine.connect() as connection:
        if IN_SCHEMA:
            # Created only when missing: a schema an administrator made for Keel needs no
            # CREATE right on the database (which CREATE SCHEMA IF NOT EXISTS checks first).
            found = text("SELECT 1 FROM pg_namespace WHERE nspname = :name")
            if connection.execute(found, {"name": SCHEMA}).first() is None:
                connection.execute(text(f"CREATE SCHEMA {SCHEMA}"))
            connection.commit()
        # Each migration commits on its own: a run of several never holds one table's locks
        # (an earlier step's) while a later step waits for another's, which a running beat
        # or worker holding that one and wanting the first would deadlock with
        # (tests/migration/test_migration_locks.py).
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            transaction_per_migration=True,
            **IN_SCHEMA,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
