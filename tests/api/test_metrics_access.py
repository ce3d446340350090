"""Who reads the system-wide views, ``GET /metrics`` and ``GET /api/v1/system/status``: the
metrics token (Prometheus's, monitoring's) and nobody else — not a tenant's operator, whose
token is for its tenant's views. ``KEEL_METRICS_PUBLIC`` opens ``/metrics`` alone. The API's
port is the public one."""

from __future__ import annotations

import pytest

from tasks.platform.config import reload_settings
from tests.support.client import bearer, metrics_headers
from web import create_app

SERIES = "keel_scrape_errors_total"
STATUS = "/api/v1/system/status"
SYSTEM_VIEWS = ["/metrics", STATUS]
TENANT_OPERATOR = bearer("acme", "olga", roles=("operator",))


@pytest.mark.parametrize("path", SYSTEM_VIEWS)
@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer not-the-metrics-token"}, 401),
        ({"Authorization": "Bearer pässwörd"}, 401),  # not ASCII: compared as bytes, no 500
        ({"Authorization": "Basic dGVzdDp0ZXN0"}, 401),
        (bearer("acme", "alice"), 403),  # a tenant's user
        (TENANT_OPERATOR, 403),  # a tenant's operator: its tenant's views only
    ],
    ids=["none", "wrong", "not-ascii", "basic", "user", "operator"],
)
def test_the_system_views_refuse_anyone_but_the_metrics_token(client, path, headers, status):
    response = client.get(path, headers=headers)
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.get_json()["error"] in ("unauthorized", "forbidden"), response.json
    text = response.get_data(as_text=True)
    assert SERIES not in text and "workers" not in text and "alive" not in text


def test_a_tenant_operator_is_told_where_the_system_views_are(client):
    refused = client.get("/metrics", headers=TENANT_OPERATOR).get_json()
    assert "KEEL_METRICS_TOKEN" in refused["message"], refused


def test_the_metrics_token_reads_the_metrics(client):
    response = client.get("/metrics", headers=metrics_headers())
    assert response.status_code == 200
    assert response.mimetype == "text/plain" and SERIES in response.get_data(as_text=True)


def test_the_metrics_token_reads_the_system_status(client):
    response = client.get(STATUS, headers=metrics_headers())
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert isinstance(body["healthy"], bool) and {"postgres", "workers", "beat"} <= set(
        body["checks"]
    )


@pytest.fixture
def public_metrics(stack, monkeypatch):
    monkeypatch.setenv("KEEL_METRICS_PUBLIC", "1")
    reload_settings()
    try:
        yield create_app({"TESTING": True}).test_client()
    finally:
        monkeypatch.delenv("KEEL_METRICS_PUBLIC")
        reload_settings()


def test_public_metrics_need_no_token_and_are_documented_so(public_metrics):
    response = public_metrics.get("/metrics")
    document = public_metrics.get("/api/v1/openapi.json").get_json()
    described = document["paths"]["/metrics"]["get"]
    assert response.status_code == 200 and SERIES in response.get_data(as_text=True)
    assert described["security"] == [] and not {"401", "403"} & set(described["responses"])


def test_public_metrics_leave_the_system_status_to_the_metrics_token(public_metrics):
    # KEEL_METRICS_PUBLIC opens /metrics alone: the status names workers' and beat's hosts
    assert public_metrics.get(STATUS).status_code == 401
    assert public_metrics.get(STATUS, headers=TENANT_OPERATOR).status_code == 403
    assert public_metrics.get(STATUS, headers=metrics_headers()).status_code == 200
    document = public_metrics.get("/api/v1/openapi.json").get_json()
    assert document["paths"][STATUS]["get"]["security"] == [{"bearer": []}]


@pytest.mark.parametrize("path", SYSTEM_VIEWS)
def test_the_system_views_behind_the_token_are_documented_so(client, path):
    described = client.get("/api/v1/openapi.json").get_json()["paths"][path]["get"]
    assert described["security"] == [{"bearer": []}]
    assert {"401", "403"} <= set(described["responses"])
    assert "KEEL_METRICS_TOKEN" in described["summary"]
