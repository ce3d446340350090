"""Signing in to the dashboard: one-time links, the session cookie, sign-out and CSRF."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from keel.cli import main
from tests.support.client import bearer, unique
from tests.support.ui import PAGE, csrf_token, signed_in
from web.tokens import issue_token
from web.ui.session import issue_link

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("signin")


def in_a_day() -> str:
    return (datetime.now(UTC) + timedelta(days=1)).isoformat()


def link_path(app, tenant: str = TENANT, user: str = "alice", roles=(), ttl: int = 60) -> str:
    return f"/ui/login/{issue_link(app.config['SECRET_KEY'], tenant, user, list(roles), ttl)}"


def test_keel_ui_link_prints_a_url_that_signs_in_once(app):
    # Given the URL `keel ui-link` prints
    result = CliRunner().invoke(
        main,
        ["ui-link", "--tenant", TENANT, "--user", "alice", "--url", "http://keel.test:8000/"],
    )
    assert result.exit_code == 0, result.output
    url = result.output.strip()
    assert url.startswith("http://keel.test:8000/ui/login/")
    path = url.removeprefix("http://keel.test:8000")
    client = app.test_client()
    # When it is opened, the browser is signed in and sent to the jobs page
    first = client.get(path)
    assert first.status_code == 303 and first.headers["Location"] == "/ui/jobs"
    cookie = first.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "keel_session=" in cookie
    assert client.get("/ui/jobs", headers=PAGE).status_code == 200
    # Then opening it a second time (anywhere) is refused
    again = app.test_client().get(path, headers=PAGE)
    assert again.status_code == 401 and "already used" in again.get_data(as_text=True)


@pytest.mark.parametrize(
    "args,problem",
    [
        (["--tenant", "../etc", "--user", "alice"], "is not an id"),
        (["--tenant", "acme", "--user", "alice", "--ttl", "3601"], "3601"),
    ],
)
def test_keel_ui_link_refuses_bad_options(args, problem):
    result = CliRunner().invoke(main, ["ui-link", *args])
    assert result.exit_code != 0 and problem in result.output


def test_an_expired_link_is_refused(app):
    path = link_path(app, ttl=1)
    time.sleep(2.1)  # past the link's one-second life
    response = app.test_client().get(path, headers=PAGE)
    assert response.status_code == 401 and "expired" in response.get_data(as_text=True)


@pytest.mark.parametrize(
    "token",
    [
        issue_link("another-key-that-is-long-enough-0123456789", "acme", "alice", ["operator"]),
        issue_token("test-secret-key-for-keel-suite-0123456789", "acme", "alice", ["operator"]),
        "x" * 5000,
        "not-a-token",
    ],
    ids=["other key", "a bearer token", "huge", "garbage"],
)
def test_a_link_not_signed_for_sign_in_is_refused(app, token):
    response = app.test_client().get(f"/ui/login/{token}")
    assert response.status_code in (400, 401), response.get_data(as_text=True)
    assert "keel_session" not in response.headers.get("Set-Cookie", "")


def test_a_link_for_an_invalid_identity_is_refused(app):
    response = app.test_client().get(link_path(app, tenant="a/b"))
    assert response.status_code == 401


def test_without_a_valid_session_pages_show_the_sign_in_page_and_fetches_get_401(app):
    client = app.test_client()
    page = client.get("/ui/jobs", headers=PAGE)
    assert page.status_code == 401 and 'id="signin"' in page.get_data(as_text=True)
    fetched = client.get("/ui/jobs/table")
    assert fetched.status_code == 401 and fetched.get_json()["error"] == "signed_out"
    # A forged cookie is no session
    client.set_cookie("keel_session", "eyJrZWVsIjp7InRlbmFudCI6ImFjbWUifX0.forged.sig")
    assert client.get("/ui/jobs", headers=PAGE).status_code == 401


def test_an_expired_session_shows_the_sign_in_page(app):
    client = app.test_client()
    signer = app.session_interface.get_signing_serializer(app)
    stale = {"keel": {"tenant": TENANT, "user": "alice", "roles": [], "exp": int(time.time()) - 1}}
    client.set_cookie("keel_session", signer.dumps(stale))
    page = client.get("/ui/jobs", headers=PAGE)
    assert page.status_code == 401 and "expired" in page.get_data(as_text=True)


def test_the_session_does_not_authenticate_the_api(app):
    """A browser session is for the pages only: the API still wants a bearer token."""
    client = signed_in(app, TENANT, "alice", ("operator",))
    assert client.get("/api/v1/jobs").status_code == 401


def test_signing_out_needs_the_csrf_token_and_ends_the_session(app):
    client = signed_in(app, TENANT, "alice")
    assert client.post("/ui/logout").status_code == 400
    assert client.get("/ui/jobs", headers=PAGE).status_code == 200
    out = client.post("/ui/logout", data={"csrf_token": csrf_token(client)})
    assert out.status_code == 303
    assert client.get("/ui/jobs", headers=PAGE).status_code == 401


def test_a_form_without_its_own_sessions_csrf_token_is_refused(app, client):
    job_id = client.post(
        "/api/v1/reports/scheduled",
        json={"reportId": unique(), "rows": 3, "runAt": in_a_day()},
        headers=bearer(tenant=TENANT),
    ).get_json()["jobId"]
    alice = signed_in(app, TENANT, "alice")
    other = signed_in(app, TENANT, "alice")
    url = f"/ui/jobs/{job_id}/cancel"
    for data in ({}, {"csrf_token": "forged"}, {"csrf_token": csrf_token(other)}):
        refused = alice.post(url, data=data)
        assert refused.status_code == 400 and refused.get_json()["error"] == "csrf_failed"
    page = alice.post(url, data={}, headers=PAGE)
    assert page.status_code == 400 and "CSRF" in page.get_data(as_text=True)
    assert (
        client.get(f"/api/v1/jobs/{job_id}", headers=bearer(tenant=TENANT)).get_json()["state"]
        == "delayed"
    )
    done = alice.post(url, data={"csrf_token": csrf_token(alice)})
    assert done.status_code == 303
