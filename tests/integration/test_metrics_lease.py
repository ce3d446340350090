"""The lease that picks the one web server serving the system-wide series
(``web.metrics_lease``), on the suite's Redis: taken when free, renewed by its holder,
refused to the others, and taken over once its holder stops renewing it."""

from __future__ import annotations

import time

import pytest

from tasks.platform.broker import redis_client
from tasks.platform.config import reload_settings
from web import metrics_lease


@pytest.fixture
def each(stack, monkeypatch):
    monkeypatch.setenv("KEEL_METRICS_SCRAPE", "each")
    monkeypatch.setattr(metrics_lease, "KEY", f"{metrics_lease.KEY}:test:{time.time_ns()}")
    reload_settings()
    yield
    redis_client().delete(metrics_lease.KEY)
    monkeypatch.undo()
    reload_settings()


def as_server(monkeypatch, name: str) -> bool:
    monkeypatch.setattr(metrics_lease, "server_id", lambda: name)
    return metrics_lease.serves_system_wide()


def test_one_server_holds_the_lease_until_it_stops_renewing_it(each, monkeypatch):
    monkeypatch.setattr(metrics_lease, "LEASE_S", 0.5)
    assert as_server(monkeypatch, "host-a/1") is True  # free: taken
    assert as_server(monkeypatch, "host-b/1") is False  # held by another
    for _ in range(4):  # the holder's scrapes renew it past its first half-second
        time.sleep(0.2)
        assert as_server(monkeypatch, "host-a/1") is True
        assert as_server(monkeypatch, "host-b/1") is False
    time.sleep(0.7)  # the holder is no longer scraped: the lease runs out
    assert as_server(monkeypatch, "host-b/1") is True
    assert as_server(monkeypatch, "host-a/1") is False


def test_with_one_target_every_server_serves_them(stack, monkeypatch):
    monkeypatch.delenv("KEEL_METRICS_SCRAPE", raising=False)
    reload_settings()
    assert as_server(monkeypatch, "host-a/1") is True
    assert as_server(monkeypatch, "host-b/1") is True
