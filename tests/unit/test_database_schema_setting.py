"""``KEEL_DATABASE_SCHEMA``: a plain SQL name, and what Keel's connections are told of it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.platform import db
from tasks.platform.config import Settings, reload_settings


@pytest.fixture
def schema_setting(monkeypatch):
    def use(value: str) -> None:
        monkeypatch.setenv("KEEL_DATABASE_SCHEMA", value)
        reload_settings()

    yield use
    monkeypatch.undo()
    reload_settings()


def test_public_is_the_default_and_adds_nothing_to_keels_connections(monkeypatch):
    monkeypatch.delenv("KEEL_DATABASE_SCHEMA", raising=False)
    assert Settings().database_schema == "public"
    reload_settings()
    assert "search_path" not in db.server_settings("background")


def test_another_schema_is_keels_connections_only_search_path(schema_setting):
    schema_setting("keel_jobs")
    assert db.server_settings("background")["search_path"] == "keel_jobs"
    assert db.startup_options(db.server_settings("background")).endswith(
        " -c search_path=keel_jobs"
    )


@pytest.mark.parametrize(
    "name", ["Keel", "keel-jobs", "1keel", "keel;drop", "keel jobs", '"keel"', "k" * 64]
)
def test_a_name_that_is_not_a_plain_sql_name_stops_the_process(monkeypatch, name):
    monkeypatch.setenv("KEEL_DATABASE_SCHEMA", name)
    with pytest.raises(ValidationError, match="database_schema"):
        Settings()


@pytest.mark.parametrize("name", ["keel", "_keel", "keel_2", "k" * 63])
def test_plain_names_are_taken(monkeypatch, name):
    monkeypatch.setenv("KEEL_DATABASE_SCHEMA", name)
    assert Settings().database_schema == name
