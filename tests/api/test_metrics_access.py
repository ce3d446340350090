"""Who reads ``GET /metrics``: the metrics token (a scraper's) or an operator; nobody else,
unless ``KEEL_METRICS_PUBLIC`` opens it. The API's port is the public one."""

from __future__ import annotations

import pytest

from tasks.config import reload_settings
from tests.support.client import bearer, metrics_headers
from web import create_app

SERIES = "keel_scrape_errors_total"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer not-the-metrics-token"}, 401),
        ({"Authorization": "Bearer pässwörd"}, 401),  # not ASCII: compared as bytes, no 500
        ({"Authorization": "Basic dGVzdDp0ZXN0"}, 401),
        (bearer("acme", "alice"), 403),  # a tenant's user
    ],
)
def test_metrics_refuse_anyone_but_the_scraper_and_operators(client, headers, status):
    response = client.get("/metrics", headers=headers)
    assert response.status_code == status
    assert response.get_json()["error"] in ("unauthorized", "forbidden"), response.json
    assert SERIES not in response.get_data(as_text=True)


@pytest.mark.parametrize(
    "headers",
    [metrics_headers(), bearer("acme", "olga", roles=("operator",))],
    ids=["token", "operator"],
)
def test_the_metrics_token_and_an_operator_read_them(client, headers):
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response.mimetype == "text/plain" and SERIES in response.get_data(as_text=True)


def test_public_metrics_need_no_token_and_are_documented_so(stack, monkeypatch):
    monkeypatch.setenv("KEEL_METRICS_PUBLIC", "1")
    reload_settings()
    try:
        client = create_app({"TESTING": True}).test_client()
        response = client.get("/metrics")
        described = client.get("/api/v1/openapi.json").get_json()["paths"]["/metrics"]["get"]
    finally:
        monkeypatch.delenv("KEEL_METRICS_PUBLIC")
        reload_settings()
    assert response.status_code == 200 and SERIES in response.get_data(as_text=True)
    assert described["security"] == [] and not {"401", "403"} & set(described["responses"])


def test_metrics_behind_a_token_are_documented_so(client):
    described = client.get("/api/v1/openapi.json").get_json()["paths"]["/metrics"]["get"]
    assert described["security"] == [{"bearer": []}]
    assert {"401", "403"} <= set(described["responses"])
