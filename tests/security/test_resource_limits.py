"""Scenario 10: resource limits.

Pass figures:
- a body past MAX_CONTENT_LENGTH is 413 on every operation that takes one;
- a recipient list past the limit is 400 naming the limit;
- a tenant flooding past its request rate gets 429 with ``Retry-After`` for
  exactly the requests over its budget, while another tenant's requests at the
  same moment all succeed (0 starved);
- tokens that fail authentication spend nobody's budget (the key is the
  verified tenant);
- with Redis unreachable the limiter fails open: no 429, no 500, one warning.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import jwt
import pytest
from flask import Flask

from keel.embedded import free_port
from tests.security.conftest import documented_operations, record_figure
from tests.support.client import bearer, metrics_headers, unique
from web import MAX_BODY_BYTES, create_app

pytestmark = pytest.mark.usefixtures("stack")
LIMIT = 20
FLOOD = 2 * LIMIT
NEIGHBOUR_REQUESTS = 10
LIST_URL = "/api/v1/schedulers"  # an operator GET of the caller's own tenant: cheap, 200


def limited_app(limit: str, **config: object) -> Flask:
    """An app with the tenant limit ``limit`` (and no per-user share unless ``config`` sets one)."""
    return create_app(
        {"TESTING": True, "KEEL_TENANT_RATE_LIMIT": limit, "KEEL_USER_RATE_LIMIT": "off", **config}
    )


def operator_of(tenant: str) -> dict[str, str]:
    return bearer(tenant=tenant, user="ops", roles=("operator",))


@pytest.fixture(scope="module")
def figures() -> Iterator[dict[str, str]]:
    found: dict[str, str] = {}
    yield found
    for name, value in found.items():
        record_figure(name, value)


@pytest.mark.parametrize(
    "op", [op for op in documented_operations() if op.body_schema], ids=lambda op: op.label
)
def test_a_body_past_the_limit_is_413(client, op):
    # Given a body one byte over MAX_CONTENT_LENGTH, from a valid operator
    url = op.path
    for param in op.path_params:
        url = url.replace("{" + param + "}", "x1")
    body = b'{"pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    response = client.open(
        url,
        method=op.method.upper(),
        data=body,
        content_type="application/json",
        # a system-wide operation takes the metrics token only (a tenant's is 403 at once)
        headers=metrics_headers()
        if op.path.startswith("/api/v1/system/")
        else operator_of(unique("big")),
    )
    # Then 413 in the error shape (and documented)
    assert response.status_code == 413, response.get_data()
    assert response.get_json()["error"] == "payload_too_large"
    assert "413" in op.spec["responses"]


def test_a_recipient_list_past_the_limit_is_400_naming_it(client):
    from web.campaigns import MAX_LISTED_RECIPIENTS

    # Given one recipient more than a campaign may list
    recipients = [{"to": f"+82-10-{n:08d}"} for n in range(MAX_LISTED_RECIPIENTS + 1)]
    body = {"name": "n", "category": "c", "template": "t", "recipients": recipients}
    # When it is posted
    response = client.post("/api/v1/campaigns", json=body, headers=operator_of(unique("big")))
    # Then 400 naming the field and the limit
    assert response.status_code == 400
    [detail] = response.get_json()["details"]
    assert detail["field"] == "recipients"
    assert f"{MAX_LISTED_RECIPIENTS}" in detail["message"]


def test_a_synthetic_count_past_the_limit_is_400_naming_it(client):
    from web.campaigns import MAX_SYNTHETIC_RECIPIENTS

    body = {
        "name": "n",
        "category": "c",
        "template": "t",
        "recipientCount": MAX_SYNTHETIC_RECIPIENTS + 1,
    }
    response = client.post("/api/v1/campaigns", json=body, headers=operator_of(unique("big")))
    assert response.status_code == 400
    [detail] = response.get_json()["details"]
    assert detail["field"] == "recipientCount"
    assert f"{MAX_SYNTHETIC_RECIPIENTS}" in detail["message"]


def test_one_tenants_flood_does_not_starve_another(figures):
    # Given a limit of 20 requests a minute per tenant, and two tenants
    app = limited_app(f"{LIMIT}/minute")
    flooder, neighbour = unique("flood"), unique("calm")
    start = Barrier(2)

    def flood() -> list:
        start.wait()
        client = app.test_client()
        return [client.get(LIST_URL, headers=operator_of(flooder)) for _ in range(FLOOD)]

    def meanwhile() -> list:
        start.wait()
        client = app.test_client()
        return [
            client.get(LIST_URL, headers=operator_of(neighbour)) for _ in range(NEIGHBOUR_REQUESTS)
        ]

    # When the first sends twice its budget while the second works normally, at the same time
    with ThreadPoolExecutor(max_workers=2) as pool:
        flooded, calm = pool.submit(flood), pool.submit(meanwhile)
        flooded, calm = flooded.result(timeout=60), calm.result(timeout=60)

    # Then the flooder got exactly its budget, and 429 + Retry-After for the rest
    statuses = Counter(r.status_code for r in flooded)
    assert statuses == {200: LIMIT, 429: FLOOD - LIMIT}, statuses
    for response in (r for r in flooded if r.status_code == 429):
        assert 1 <= int(response.headers["Retry-After"]) <= 60
        assert response.get_json()["error"] == "too_many_requests"
    # And the neighbour was not starved: every one of its requests succeeded
    assert [r.status_code for r in calm] == [200] * NEIGHBOUR_REQUESTS
    figures["tenant rate limit"] = (
        f"flooder {statuses[200]} ok / {statuses[429]} x 429 (limit {LIMIT}/minute), "
        f"neighbour {NEIGHBOUR_REQUESTS}/{NEIGHBOUR_REQUESTS} ok, 0 starved"
    )


def test_one_user_takes_only_its_share_of_the_tenants_budget(figures):
    # Given a tenant budget of 20 a minute, of which one user may take 10
    app = limited_app(f"{LIMIT}/minute", KEEL_USER_RATE_LIMIT=f"{LIMIT // 2}/minute")
    client = app.test_client()
    tenant = unique("shared")
    # When one user of the tenant sends the whole tenant budget
    runaway = [
        client.get(LIST_URL, headers=bearer(tenant=tenant, user="script", roles=("operator",)))
        for _ in range(LIMIT)
    ]
    # Then it gets its share, and 429s naming the per-user limit for the rest
    assert Counter(r.status_code for r in runaway) == {200: LIMIT // 2, 429: LIMIT // 2}
    refused = runaway[-1].get_json()
    assert refused["details"][0]["limit"] == "userRequestRate"
    # And another user of the same tenant is still served from what is left
    colleague = [
        client.get(LIST_URL, headers=bearer(tenant=tenant, user="human", roles=("operator",)))
        for _ in range(LIMIT // 2)
    ]
    assert [r.status_code for r in colleague] == [200] * (LIMIT // 2)
    figures["per-user share"] = (
        f"one user {LIMIT // 2}/{LIMIT} ok then 429 (userRequestRate), colleague "
        f"{LIMIT // 2}/{LIMIT // 2} ok"
    )


def test_failed_authentication_spends_no_tenants_budget():
    # Given a tenant with a budget of 20, and forged tokens that claim to be that tenant
    app = limited_app(f"{LIMIT}/minute")
    client = app.test_client()
    victim = unique("victim")
    claims = {"sub": "x", "tenant": victim, "roles": ["operator"], "exp": 2**33}
    forged = jwt.encode(claims, "not-the-secret-but-long-enough-for-hs256-ok", algorithm="HS256")
    # When an attacker sends twice the budget with them
    rejected = [
        client.get(LIST_URL, headers={"Authorization": f"Bearer {forged}"}) for _ in range(FLOOD)
    ]
    assert {r.status_code for r in rejected} == {401}
    # Then the tenant still has its whole budget
    served = [client.get(LIST_URL, headers=operator_of(victim)) for _ in range(LIMIT)]
    assert [r.status_code for r in served] == [200] * LIMIT


def test_with_redis_unreachable_the_limiter_fails_open(caplog, figures):
    # Given a limiter whose Redis cannot be reached (nothing listens on that port)
    app = limited_app("1/minute", KEEL_RATELIMIT_STORAGE_URL=f"redis://127.0.0.1:{free_port()}/0")
    client = app.test_client()
    headers = operator_of(unique("open"))
    # When the tenant sends more than its limit
    with caplog.at_level(logging.WARNING, logger="web.ratelimit"):
        statuses = [client.get(LIST_URL, headers=headers).status_code for _ in range(5)]
    # Then every request is served (no 429, no 500) and the outage is logged once
    assert statuses == [200] * 5
    warnings = [r for r in caplog.records if r.name == "web.ratelimit"]
    assert len(warnings) == 1 and "letting requests through" in warnings[0].getMessage()
    figures["rate limiter, Redis down"] = "5/5 served, 0 x 429, 0 x 500, 1 warning"


def test_the_rate_limit_is_documented_on_authenticated_operations():
    for op in documented_operations():
        assert ("429" in op.spec["responses"]) == op.authenticated, op.label
