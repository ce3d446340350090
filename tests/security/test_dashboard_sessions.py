"""Dashboard sessions end on the server; sign-in links never switch a session behind a person's
back; the cookie and headers suit HTTPS.

A captured ``keel_session`` cookie (with the CSRF token of its pages) is replayed
after sign-out, "sign out everywhere", an idle period and a secret rotation that drops the
old key (one that keeps it as a fallback keeps them):
every dashboard route — enumerated from the app's URL map, so a page added
later is covered — must answer 401. The login-CSRF cases send the headers a
browser sends on a cross-site navigation (the browser tier does it in Chromium).
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tasks.platform.config import reload_settings
from tests.support.client import bearer, unique
from tests.support.keel_up import KEEL
from tests.support.ui import PAGE, csrf_token, signed_in
from web import create_app
from web.ui.session import NONCE_KEY, issue_link

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("sessions")
# Not the dashboard's own business: sign-in, its assets, the redirect to the jobs page.
# (the identity provider's sign-in: its own state cookie is its credential; web.ui.oidc)
OPEN = {
    "ui.static",
    "ui.login",
    "ui.confirm_login",
    "ui.signin",
    "ui.home",
    "ui.oidc_login",
    "ui.oidc_callback",
}
CROSS_SITE = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", **PAGE}
TYPED = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", **PAGE}


def delayed_job(client: FlaskClient) -> str:
    run_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    response = client.post(
        "/api/v1/reports/scheduled",
        json={"reportId": unique(), "rows": 3, "runAt": run_at},
        headers=bearer(tenant=TENANT, user="olga"),
    )
    assert response.status_code == 202, response.get_data(as_text=True)
    return response.get_json()["jobId"]


def dashboard_requests(app: Flask, job_id: str) -> list[tuple[str, str]]:
    """(method, path) of every dashboard route, its ids filled with a real job's."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("ui.") or rule.endpoint in OPEN:
            continue
        path = rule.build({name: job_id for name in rule.arguments}, append_unknown=False)[1]
        for method in sorted((rule.methods or set()) & {"GET", "POST"}):
            found.append((method, path))
    return found


def answers(client: FlaskClient, method: str, path: str, token: str) -> int:
    if method == "GET":
        response = client.get(path, headers={**PAGE, "Sec-Fetch-Mode": "navigate"})
    else:
        data = {"csrf_token": token, "reason": "a reason long enough", "id": "x", "everywhere": ""}
        response = client.post(path, data=data, headers=PAGE)
    status = response.status_code
    response.close()  # an event stream, if the session had still been good
    return status


def copy_of(app: Flask, client: FlaskClient) -> FlaskClient:
    """Another client holding the same cookie: what an attacker copied from the browser."""
    cookie = client.get_cookie("keel_session")
    assert cookie is not None
    thief = app.test_client()
    thief.set_cookie("keel_session", cookie.value)
    return thief


def refusals(app: Flask, thief: FlaskClient, token: str, job_id: str) -> dict[str, int]:
    """The routes that did not answer 401 to the copied cookie, with what they answered."""
    seen = {
        f"{method} {path}": answers(thief, method, path, token)
        for method, path in dashboard_requests(app, job_id)
    }
    return {label: status for label, status in seen.items() if status != 401}


def test_a_cookie_copied_before_sign_out_is_refused_on_every_page_and_form(app, client):
    job_id = delayed_job(client)
    olga = signed_in(app, TENANT, "olga", ("operator",))
    token = csrf_token(olga)
    thief = copy_of(app, olga)
    # The copy works while the session lives (the routes exist and answer it)
    assert thief.get(f"/ui/jobs/{job_id}", headers=PAGE).status_code == 200
    assert len(dashboard_requests(app, job_id)) >= 10
    # When olga signs out
    assert olga.post("/ui/logout", data={"csrf_token": token}).status_code == 303
    # Then the copied cookie and its CSRF token get 401 everywhere: pages, fetches and forms
    assert refusals(app, thief, token, job_id) == {}
    page = thief.get("/ui/jobs", headers=PAGE).get_data(as_text=True)
    assert 'id="signin"' in page and "has ended" in page
    # And nothing was done with it
    state = client.get(f"/api/v1/jobs/{job_id}", headers=bearer(tenant=TENANT, user="olga"))
    assert state.get_json()["state"] == "delayed"


def test_sign_out_everywhere_ends_every_browser_of_that_user_only(app):
    laptop = signed_in(app, TENANT, "alice")
    phone = signed_in(app, TENANT, "alice")
    bob = signed_in(app, TENANT, "bob")
    out = laptop.post("/ui/logout", data={"csrf_token": csrf_token(laptop), "everywhere": "1"})
    assert out.status_code == 303
    assert laptop.get("/ui/jobs", headers=PAGE).status_code == 401
    assert phone.get("/ui/jobs", headers=PAGE).status_code == 401
    assert bob.get("/ui/jobs", headers=PAGE).status_code == 200


def test_keel_ui_signout_ends_a_users_sessions_from_the_command_line(app):
    # Given two browsers of carol's and one of dave's
    laptop = signed_in(app, TENANT, "carol")
    phone = signed_in(app, TENANT, "carol")
    dave = signed_in(app, TENANT, "dave")
    # When an operator ends carol's sessions with the CLI (the suite's settings: same Redis)
    done = subprocess.run(
        [KEEL, "ui-signout", "--tenant", TENANT, "--user", "carol"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ended 2 dashboard sessions of {TENANT}/carol"
    # Then both of carol's browsers are signed out at once, and dave's is not
    assert laptop.get("/ui/jobs", headers=PAGE).status_code == 401
    assert phone.get("/ui/jobs", headers=PAGE).status_code == 401
    assert dave.get("/ui/jobs", headers=PAGE).status_code == 200


def test_a_session_nobody_uses_ends_after_the_idle_timeout(stack):
    app = create_app({"TESTING": True, "KEEL_UI_IDLE_S": 2})
    # A person opening pages keeps the session (past the idle timeout in total)
    busy = signed_in(app, TENANT, "alice")
    for _ in range(5):
        time.sleep(0.8)
        assert (
            busy.get("/ui/jobs", headers={**PAGE, "Sec-Fetch-Mode": "navigate"}).status_code == 200
        )
    # A page's own refreshes (fetches) are answered but do not keep it
    watched = signed_in(app, TENANT, "alice")
    for _ in range(2):
        time.sleep(0.8)
        assert watched.get("/ui/jobs/table", headers={"Sec-Fetch-Mode": "cors"}).status_code == 200
    time.sleep(0.8)
    assert watched.get("/ui/jobs/table", headers={"Sec-Fetch-Mode": "cors"}).status_code == 401
    # And a session left alone is over, page and form alike
    idle = signed_in(app, TENANT, "alice")
    token = csrf_token(idle)
    time.sleep(2.5)
    page = idle.get("/ui/jobs", headers=PAGE)
    assert page.status_code == 401 and "has ended" in page.get_data(as_text=True)
    assert idle.post("/ui/logout", data={"csrf_token": token}).status_code == 401


def test_a_rotated_key_kept_as_a_fallback_keeps_sessions_and_a_dropped_one_ends_them(stack):
    old = create_app({"TESTING": True})
    olga = signed_in(old, TENANT, "olga", ("operator",))
    assert olga.get("/ui/jobs", headers=PAGE).status_code == 200
    rotated = create_app(
        {
            "TESTING": True,
            "SECRET_KEY": "a-rotated-secret-key-for-the-keel-suite-987",
            "SECRET_KEY_FALLBACKS": [old.config["SECRET_KEY"]],
        }
    )
    # The old key kept as a fallback (a routine rotation): the session goes on
    assert copy_of(rotated, olga).get("/ui/jobs", headers=PAGE).status_code == 200
    # and a new sign-in link, signed with the new key, works beside an old one
    fresh = signed_in(rotated, TENANT, "alice")
    assert fresh.get("/ui/jobs", headers=PAGE).status_code == 200
    # The old key dropped (it leaked): every session it started is over
    dropped = create_app(
        {"TESTING": True, "SECRET_KEY": "a-rotated-secret-key-for-the-keel-suite-987"}
    )
    assert copy_of(dropped, olga).get("/ui/jobs", headers=PAGE).status_code == 401
    assert copy_of(dropped, fresh).get("/ui/jobs", headers=PAGE).status_code == 200


def link_for(app: Flask, user: str, roles: tuple[str, ...] = ()) -> str:
    token = issue_link(app.config["SECRET_KEY"], TENANT, user, list(roles), 60)
    return f"/ui/login/{token}"


def link_unused(path: str) -> bool:
    from itsdangerous import URLSafeTimedSerializer

    from tasks.platform import broker

    claims = URLSafeTimedSerializer("unused").loads_unsafe(path.rsplit("/", 1)[1])[1]
    return not broker.redis_client().exists(NONCE_KEY.format(nonce=claims["n"]))


def who(client: FlaskClient) -> str | None:
    page = client.get("/ui/signin", headers=PAGE).get_data(as_text=True)
    for user in ("olga", "mallory", "alice"):
        if f"signed in as <strong>{user}</strong>" in page:
            return user
    return None


@pytest.mark.parametrize(
    "headers",
    [CROSS_SITE, {"Referer": "https://evil.example/page", **PAGE}, {"Origin": "null", **PAGE}],
    ids=["fetch metadata", "foreign referer", "opaque origin"],
)
def test_a_link_arriving_from_another_site_asks_first_and_sets_no_cookie(app, headers):
    mallory = link_for(app, "mallory", ("operator",))
    # A browser holding a session does not send it on a cross-site navigation (Strict)
    browser = app.test_client()
    page = browser.get(mallory, headers=headers)
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert 'id="signin-confirm"' in text and "mallory" in text and 'id="continue"' in text
    # No cookie is set (it would replace the operator's), the link is not spent
    assert "Set-Cookie" not in page.headers
    assert link_unused(mallory)
    # Continue (a same-origin navigation, which would carry a session) signs in
    onward = browser.get(mallory, headers={"Sec-Fetch-Site": "same-origin", **PAGE})
    assert onward.status_code == 303 and who(browser) == "mallory"


def test_a_link_opened_while_signed_in_switches_only_on_a_post_with_the_csrf_token(app):
    olga = signed_in(app, TENANT, "olga", ("operator",))
    mallory = link_for(app, "mallory")
    for headers in (TYPED, CROSS_SITE | {"Sec-Fetch-Site": "same-site"}, PAGE):
        page = olga.get(mallory, headers=headers)
        text = page.get_data(as_text=True)
        assert page.status_code == 200 and 'id="confirm-form"' in text
        assert "olga" in text and "mallory" in text
        assert who(olga) == "olga" and link_unused(mallory)
    thief = copy_of(app, olga)
    # A POST without the session's CSRF token is refused
    assert olga.post(mallory, data={}).status_code == 400
    assert app.test_client().post(mallory, data={"csrf_token": "x"}).status_code == 400
    assert who(olga) == "olga" and link_unused(mallory)
    # With it, the browser switches, and olga's earlier session is over
    switched = olga.post(mallory, data={"csrf_token": csrf_token(olga)})
    assert switched.status_code == 303 and switched.headers["Location"] == "/ui/jobs"
    assert who(olga) == "mallory" and not link_unused(mallory)
    assert thief.get("/ui/jobs", headers=PAGE).status_code == 401


def test_over_https_the_cookie_is_secure_with_hsts_and_a_same_origin_referrer_policy(app):
    https = app.test_client()
    path = link_for(app, "alice")
    first = https.get(path, base_url="https://keel.test", headers=TYPED)
    assert first.status_code == 303
    assert "; Secure" in first.headers["Set-Cookie"]
    page = https.get("/ui/jobs", base_url="https://keel.test", headers=PAGE)
    assert page.headers["Strict-Transport-Security"].startswith("max-age=")
    assert page.headers["Referrer-Policy"] == "same-origin"
    # The form the page carries passes flask-wtf's HTTPS check with the same-origin Referer
    token = csrf_token_over(https, "https://keel.test")
    out = https.post(
        "/ui/logout",
        base_url="https://keel.test",
        data={"csrf_token": token},
        headers={"Referer": "https://keel.test/ui/jobs"},
    )
    assert out.status_code == 303
    # Plain HTTP (keel up on loopback): no Secure (a browser would drop it), no HSTS
    plain = app.test_client()
    response = plain.get(link_for(app, "alice"), headers=TYPED)
    assert "Secure" not in response.headers["Set-Cookie"]
    assert "Strict-Transport-Security" not in plain.get("/ui/jobs", headers=PAGE).headers


def test_keel_ui_secure_cookie_makes_the_cookie_secure_on_http_too(stack, monkeypatch):
    monkeypatch.setenv("KEEL_UI_SECURE_COOKIE", "1")
    reload_settings()
    try:
        app = create_app({"TESTING": True})
    finally:
        monkeypatch.undo()
        reload_settings()
    response = app.test_client().get(link_for(app, "alice"), headers=TYPED)
    assert "; Secure" in response.headers["Set-Cookie"]


def csrf_token_over(client: FlaskClient, base_url: str) -> str:
    from tests.support.ui import CSRF_FIELD

    page = client.get("/ui/signin", base_url=base_url, headers=PAGE).get_data(as_text=True)
    found = CSRF_FIELD.search(page)
    assert found
    return found.group(1)
