"""The reports API's contract: validation, authentication and ownership."""

from __future__ import annotations

import time

import jwt
import pytest

from tests.support.client import bearer, metrics_headers, token, unique

pytestmark = pytest.mark.usefixtures("stack")
URL = "/api/v1/reports"


def assert_error(response, status: int) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error", "message", "details"}
    assert isinstance(body["error"], str) and body["message"]
    return body


@pytest.mark.parametrize(
    "body",
    [
        {"reportId": "a", "rows": 0},
        {"reportId": "a", "rows": 100_001},
        {"rows": 10},
        {"reportId": "a", "rows": 10, "color": "red"},
        {"reportId": "a", "rows": "10"},
        {"reportId": "a", "rows": 10.5},
        {"reportId": "a", "rows": True},
        {"reportId": "", "rows": 10},
        {"reportId": "a", "rows": 10, "failUntilAttempt": 6},
        {"reportId": "a", "rows": 10, "tenantId": "other"},
        ["reportId", "rows"],
    ],
)
def test_invalid_bodies_are_rejected_with_the_error_shape(client, body):
    assert_error(client.post(URL, json=body, headers=bearer()), 400)


def test_malformed_json_is_400(client):
    response = client.post(
        URL, data='{"reportId": "a", "rows":', headers=bearer(), content_type="application/json"
    )
    assert assert_error(response, 400)["error"] == "malformed_json"


def test_wrong_content_type_is_400(client):
    response = client.post(
        URL,
        data="reportId=a&rows=10",
        headers=bearer(),
        content_type="application/x-www-form-urlencoded",
    )
    assert assert_error(response, 400)["error"] == "invalid_content_type"


def test_fail_until_attempt_needs_fault_injection(app):
    app.config["KEEL_FAULT_INJECTION"] = False
    try:
        response = app.test_client().post(
            URL, json={"reportId": "a", "rows": 10, "failUntilAttempt": 1}, headers=bearer()
        )
    finally:
        app.config["KEEL_FAULT_INJECTION"] = True
    body = assert_error(response, 400)
    assert body["details"][0]["field"] == "failUntilAttempt"


def test_oversized_body_is_413(client):
    response = client.post(
        URL,
        data="{" + " " * (2 * 1024 * 1024) + "}",
        headers=bearer(),
        content_type="application/json",
    )
    assert_error(response, 413)


def test_unknown_route_and_method_use_the_error_shape(client):
    assert_error(client.get("/api/v1/nothing-here", headers=bearer()), 404)
    assert_error(client.delete(URL, headers=bearer()), 405)


SECRET_FOR_FORGERY = "not-the-server-secret-but-long-enough-for-hs256"


def forged_tokens() -> dict[str, str]:
    now = int(time.time())
    claims = {"sub": "alice", "tenant": "acme", "roles": [], "exp": now + 600}
    header = jwt.utils.base64url_encode(b'{"alg":"none","typ":"JWT"}').decode()
    import json

    payload = jwt.utils.base64url_encode(json.dumps(claims).encode()).decode()
    return {
        "alg none": f"{header}.{payload}.",
        "bad signature": jwt.encode(claims, SECRET_FOR_FORGERY, algorithm="HS256"),
        "expired": token(ttl=-10),
        "garbage": "not-a-token",
    }


@pytest.mark.parametrize("case", ["missing", "alg none", "bad signature", "expired", "garbage"])
def test_requests_without_a_valid_token_are_401(client, case):
    headers = {} if case == "missing" else {"Authorization": f"Bearer {forged_tokens()[case]}"}
    assert_error(client.post(URL, json={"reportId": "a", "rows": 1}, headers=headers), 401)
    assert_error(client.get(f"{URL}/jobs/anything", headers=headers), 401)


def test_accepted_job_is_readable_by_its_owner_only(client):
    response = client.post(URL, json={"reportId": unique(), "rows": 5}, headers=bearer())
    assert response.status_code == 202
    accepted = response.get_json()
    assert accepted["accepted"] is True and accepted["deduplicated"] is False
    assert accepted["statusUrl"] == f"{URL}/jobs/{accepted['jobId']}"

    mine = client.get(accepted["statusUrl"], headers=bearer())
    assert mine.status_code == 200
    assert mine.get_json()["name"] == "report.generate"

    missing = client.get(f"{URL}/jobs/{'0' * 32}", headers=bearer())
    other_tenant = client.get(accepted["statusUrl"], headers=bearer(tenant="globex"))
    other_user = client.get(accepted["statusUrl"], headers=bearer(user="mallory"))
    for response in (other_tenant, other_user):
        assert_error(response, 404)
        assert response.get_json() == missing.get_json()


def test_owner_comes_from_the_token(client):
    from tasks.jobs.observe.queries import get

    response = client.post(
        URL, json={"reportId": unique(), "rows": 5}, headers=bearer(tenant="initech", user="peter")
    )
    job = get(response.get_json()["jobId"])
    assert (job.tenant_id, job.user_id) == ("initech", "peter")
    assert set(job.data) == {"reportId", "rows"}  # identity lives in the owner, never in data


def test_health_and_openapi_need_no_token(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    spec = client.get("/api/v1/openapi.json").get_json()
    assert spec["openapi"].startswith("3.")
    post = spec["paths"]["/api/v1/reports"]["post"]
    schema_ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = spec["components"]["schemas"][schema_ref.rsplit("/", 1)[1]]
    assert schema["properties"]["rows"]["maximum"] == 100_000
    assert schema["additionalProperties"] is False
    assert "/api/v1/reports/jobs/{job_id}" in spec["paths"]


def test_metrics_are_prometheus_text(client):
    response = client.get("/metrics", headers=metrics_headers())
    assert response.status_code == 200
    assert 'keel_jobs{queue="reports",state="completed"}' in response.get_data(as_text=True)
