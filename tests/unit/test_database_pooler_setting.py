"""``KEEL_DATABASE_POOLER``: what Keel's connections send at start, and at each transaction."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.jobs.upkeep import committed
from tasks.platform import db
from tasks.platform.config import Settings, reload_settings


@pytest.fixture
def env(monkeypatch):
    def use(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"KEEL_{name.upper()}", value)
        reload_settings()

    monkeypatch.delenv("KEEL_DATABASE_POOLER", raising=False)
    monkeypatch.delenv("KEEL_DATABASE_DIRECT_URL", raising=False)
    yield use
    monkeypatch.undo()
    reload_settings()


def test_by_default_the_settings_are_startup_options_as_before(env):
    env()
    assert not db.pooled()
    assert db.begin_statement("background") is None
    assert db.startup_options(db.server_settings("request")) == (
        "-c statement_timeout=1000 -c idle_in_transaction_session_timeout=35000"
    )


def test_behind_a_transaction_pooler_one_statement_sets_them_for_its_transaction(env):
    env(database_pooler="Transaction", database_schema="keel_jobs")
    assert db.pooled()
    assert db.begin_statement("request") == (
        "SELECT set_config('statement_timeout', '1000', true), "
        "set_config('idle_in_transaction_session_timeout', '35000', true), "
        "set_config('search_path', 'keel_jobs', true)"
    )


def test_an_unknown_pooler_mode_stops_the_process(env, monkeypatch):
    monkeypatch.setenv("KEEL_DATABASE_POOLER", "session")
    with pytest.raises(ValidationError, match="database_pooler"):
        Settings()


def test_the_commit_listener_uses_the_direct_url_and_else_skips_a_transaction_pooler(env):
    env(database_url="postgresql://keel@pooler:6432/keel")
    assert committed.conninfo() == "postgresql://keel@pooler:6432/keel"
    env(database_pooler="transaction")
    assert committed.conninfo() is None
    env(database_direct_url="postgres://keel@db:5432/keel")
    assert committed.conninfo() == "postgresql://keel@db:5432/keel"
