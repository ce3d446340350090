"""The API's access log and request ids (``web.access``)."""

from __future__ import annotations

import json
import logging

import pytest

from tasks.platform import logs
from tests.support.client import bearer


@pytest.fixture
def access(caplog):
    caplog.set_level(logging.INFO, logger="keel.access")
    return caplog


def access_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "keel.access"]


def test_a_request_gets_one_line_with_its_route_template_status_tenant_and_job(client, access):
    headers = bearer()
    response = client.post(
        "/api/v1/jobs", json={"name": "test.echo", "data": {"n": 1}}, headers=headers
    )
    assert response.status_code == 202
    job_id = response.get_json()["jobId"]
    read = client.get(f"/api/v1/jobs/{job_id}", headers=headers)
    assert read.status_code == 200
    added, looked_up = access_lines(access)
    assert (added.method, added.route, added.status) == ("POST", "/api/v1/jobs", 202)
    assert (added.tenant_id, added.job_id) == ("acme", job_id)
    # the route's template, never the path (which may hold an id or a sign-in token)
    assert looked_up.route == "/api/v1/jobs/<job_id>" and job_id not in looked_up.getMessage()
    assert added.request_id == response.headers["X-Request-ID"] != read.headers["X-Request-ID"]
    assert added.duration_ms >= 0
    # Formatted, the line holds no part of the bearer token
    token = headers["Authorization"].split()[1]
    for formatter in (logs.JsonLines(), logs.TextLines()):
        assert token not in formatter.format(added)
    assert json.loads(logs.JsonLines().format(added))["route"] == "/api/v1/jobs"


def test_the_callers_request_id_is_kept_when_it_is_a_plain_token(client, access):
    kept = client.get("/healthz", headers={"X-Request-ID": "edge-1234:abc"})
    assert kept.headers["X-Request-ID"] == "edge-1234:abc"
    replaced = client.get("/healthz", headers={"X-Request-ID": "a b;<script>"})
    assert replaced.headers["X-Request-ID"] != "a b;<script>"
    assert len(replaced.headers["X-Request-ID"]) == 32
    assert [r.request_id for r in access_lines(access)] == [
        "edge-1234:abc",
        replaced.headers["X-Request-ID"],
    ]


def test_an_unknown_path_is_logged_without_its_path(client, access):
    response = client.get("/no/such/eyJhbGciOiJIUzI1NiJ9.secret.part")
    assert response.status_code == 404
    [line] = access_lines(access)
    assert line.route == "<unmatched>" and "eyJ" not in logs.JsonLines().format(line)
