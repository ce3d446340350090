"""The provider sandbox refuses what a web page in the developer's browser could send it.

A cross-site ``text/plain`` POST (no preflight), a foreign ``Origin``, and a
``Host`` that is an outside domain name (DNS rebinding) are refused before
any route runs; Keel's own client (JSON, no Origin, a loopback or service
name) goes through.
"""

from __future__ import annotations

import pytest

from provider_sandbox.app import create_app
from provider_sandbox.state import EXTENSION


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    monkeypatch.delenv("KEEL_SANDBOX_HOSTS", raising=False)
    app = create_app(tmp_path, capacity=100, admin_key="k" * 32)
    yield app.test_client()
    app.extensions[EXTENSION].close()


def groups(sandbox, **kwargs):
    return sandbox.post("/v1/groups", **kwargs)


def test_a_cross_site_text_plain_post_creates_nothing(sandbox):
    answer = groups(
        sandbox,
        data='{"name": "x"}',
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
    )
    assert answer.status_code == 403 and answer.get_json()["error"] == "forbidden"
    # Nor with a JSON type (a CORS preflight would be needed, but it is refused all the same)
    answer = groups(sandbox, json={"name": "x"}, headers={"Origin": "http://evil.example"})
    assert answer.status_code == 403


def test_a_body_that_is_not_json_is_refused(sandbox):
    answer = groups(sandbox, data='{"name": "x"}', headers={"Content-Type": "text/plain"})
    assert answer.status_code == 415


@pytest.mark.parametrize("host", ["evil.example", "rebind.attacker.test:8025"])
def test_an_outside_host_name_is_refused(sandbox, host):
    answer = groups(sandbox, json={"name": "x"}, headers={"Host": host})
    assert answer.status_code == 403
    assert sandbox.get("/v1/ledger", headers={"Host": host}).status_code == 403


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8025", "localhost:8025", "[::1]:8025", "sandbox:8025", "10.0.0.7"]
)
def test_keels_client_gets_through(sandbox, host):
    answer = groups(sandbox, json={"name": "x"}, headers={"Host": host})
    assert answer.status_code == 201, answer.get_json()
    same_origin = groups(
        sandbox, json={"name": "y"}, headers={"Host": host, "Origin": f"http://{host}"}
    )
    assert same_origin.status_code == 201


def test_named_hosts_are_allowed_by_setting(sandbox, monkeypatch):
    monkeypatch.setenv("KEEL_SANDBOX_HOSTS", "sandbox.dev.internal")
    answer = groups(sandbox, json={}, headers={"Host": "sandbox.dev.internal:8025"})
    assert answer.status_code == 201
