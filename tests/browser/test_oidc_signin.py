"""The dashboard's sign-in with the team's identity provider, in headless Chromium: the
authorization code flow with PKCE against the OpenID Connect stand-in
(tests/support/oidc.py), from the sign-in page's button to the jobs page."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from keel.embedded import free_port
from tasks.platform.config import reload_settings
from tests.support.browser import ServedApp, wait
from tests.support.client import unique
from tests.support.oidc import AUDIENCE, CLIENT_ID, CLIENT_SECRET, OidcProvider
from web import create_app, oidc


@pytest.fixture
def provider():
    started = OidcProvider().start()
    yield started
    started.stop()


@pytest.fixture
def served_with_oidc(stack, provider, monkeypatch):
    """The app configured for the provider, served where KEEL_PUBLIC_URL says it is."""
    port = free_port()
    for name, value in {
        "KEEL_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "KEEL_OIDC_ISSUER": provider.issuer,
        "KEEL_OIDC_CLIENT_ID": CLIENT_ID,
        "KEEL_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "KEEL_OIDC_AUDIENCE": AUDIENCE,
    }.items():
        monkeypatch.setenv(name, value)
    reload_settings()
    oidc._found.clear()
    served = ServedApp(create_app(), port=port).start()
    yield served
    served.stop()
    monkeypatch.undo()
    reload_settings()
    oidc._found.clear()


def test_signing_in_with_the_identity_provider_opens_the_jobs_page(
    served_with_oidc, provider, browser
):
    tenant = unique("sso")
    provider.user = {"sub": "olga", "tenant": tenant, "roles": ["operator"]}
    browser.get(f"{served_with_oidc.url}/ui/signin")
    browser.delete_all_cookies()
    try:
        browser.get(f"{served_with_oidc.url}/ui/signin")
        browser.find_element(By.ID, "oidc-signin").click()
        # to the provider, which signs olga in at once and sends the browser back
        wait(browser, lambda d: d.current_url.startswith(f"{served_with_oidc.url}/ui/jobs"))
        page = browser.find_element(By.TAG_NAME, "body").text
        assert "olga" in page and tenant in page, page[:2000]
        # The flow's cookie is gone; the session is the dashboard's own
        names = {cookie["name"] for cookie in browser.get_cookies()}
        assert "keel_session" in names and "keel_oidc" not in names, names
        # A callback replayed (the code is spent, and no flow was started) signs nobody in
        browser.delete_all_cookies()
        browser.get(f"{served_with_oidc.url}/ui/oidc/callback?code=stolen&state=forged")
        assert "not started" in browser.find_element(By.TAG_NAME, "body").text
        assert "keel_session" not in {cookie["name"] for cookie in browser.get_cookies()}
    finally:
        browser.get("about:blank")
