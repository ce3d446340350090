"""Postgres access: one declarative base, one engine per process.

The engine is created lazily and re-created after a fork, so Celery's
prefork children and gunicorn workers never share a connection pool with
their parent. Callers own transactions (``with transaction() as s:``);
helpers take a session and never commit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import MetaData, create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from tasks.config import get_settings

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every Keel table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


_state: dict[str, object] = {}


def engine() -> Engine:
    if _state.get("pid") != os.getpid():
        settings = get_settings()
        _state["engine"] = create_engine(
            settings.sqlalchemy_url,
            pool_size=5,
            max_overflow=10,
            pool_pre_ping=True,
            pool_timeout=5,
            connect_args={"connect_timeout": 5},
        )
        _state["sessionmaker"] = sessionmaker(_state["engine"], expire_on_commit=False)
        _state["pid"] = os.getpid()
    return _state["engine"]  # type: ignore[return-value]


def dispose() -> None:
    """Forget this process's engine (after a fork, or in tests)."""
    eng = _state.pop("engine", None)
    _state.pop("pid", None)
    if eng is not None:
        eng.dispose(close=False)  # type: ignore[attr-defined]


@contextmanager
def transaction() -> Iterator[Session]:
    """A session inside one committed-or-rolled-back transaction."""
    engine()
    factory: sessionmaker[Session] = _state["sessionmaker"]  # type: ignore[assignment]
    with factory.begin() as session:
        yield session
