"""The dashboard in Chromium over HTTPS, behind a TLS-terminating proxy, as deployed.

gunicorn serves the app exactly as ``keel up`` and compose do (``web.gunicorn_conf``);
in front of it a loopback proxy (``tests.support.tls``) terminates real TLS with
a throwaway certificate, which this Chromium trusts by its key
(``--ignore-certificate-errors-spki-list``: no certificate error, so the origin
is secure), and forwards with ``X-Forwarded-Proto: https``, which gunicorn
trusts from loopback. So the app sees HTTPS requests and flask-wtf makes its
strict HTTPS Referer check on every form: sign-in, cancel, retry, resume,
scheduler create/edit/remove and sign-out are each submitted by the browser.
"""

from __future__ import annotations

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen

from tasks.jobs import JobOptions, Owner, add
from tasks.platform.config import get_settings
from tests.browser.test_dashboard import in_seconds, text_of
from tests.support.browser import chromium, wait
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import WebProcess
from tests.support.tls import Certificate, TlsProxy, throwaway_certificate
from web.ui.session import issue_link

TENANT = unique("ui-tls")
OPERATOR = bearer(tenant=TENANT, user="olga", roles=("operator",))
REFUSED = "the form was refused"


class Site:
    def __init__(self, proxy: TlsProxy, certificate: Certificate) -> None:
        self.url = proxy.url
        self.ca = str(certificate.cert)
        self.spki = certificate.spki_sha256

    def link(self, user: str, roles: tuple[str, ...] = ()) -> str:
        secret = get_settings().secret_key
        assert secret
        return f"{self.url}/ui/login/{issue_link(secret, TENANT, user, list(roles), 60)}"

    def api(self, method: str, path: str, **body) -> dict:
        response = requests.request(
            method,
            f"{self.url}/api/v1{path}",
            headers=OPERATOR,
            json=body or None,
            timeout=10,
            verify=self.ca,
        )
        assert response.status_code in (200, 202), response.text
        return response.json()


@pytest.fixture(scope="module")
def site(stack, tmp_path_factory):
    certificate = throwaway_certificate(tmp_path_factory.mktemp("tls"))
    web = WebProcess(stack.home, extra_args=["--workers", "1"])
    web.start()
    proxy = TlsProxy(certificate, web.port).start()
    yield Site(proxy, certificate)
    proxy.stop()
    web.stop()


@pytest.fixture(scope="module")
def tls_browser(site):
    """A Chromium of its own that trusts the proxy's certificate (by its key)."""
    driver = chromium(f"--ignore-certificate-errors-spki-list={site.spki}")
    yield driver
    driver.quit()


def no_refusal(browser) -> str:
    """The flash the answer's page shows (after the redirect), never flask-wtf's refusal."""
    shown = wait(browser, lambda driver: text_of(driver, ".flash"))
    assert REFUSED not in browser.page_source, shown
    return shown


def test_every_dashboard_form_works_in_chromium_over_https(worker, site, tls_browser):
    browser = tls_browser
    # Sign-in: the link typed into the address bar, over HTTPS
    browser.get(site.link("olga", ("operator",)))
    wait(browser, seen.url_to_be(f"{site.url}/ui/jobs"))
    [cookie] = [c for c in browser.get_cookies() if c["name"] == "keel_session"]
    assert cookie["secure"] is True and cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    signed_in = cookie["value"]
    page = requests.get(f"{site.url}/ui/jobs", timeout=10, verify=site.ca)
    assert page.headers["Strict-Transport-Security"].startswith("max-age=")
    assert page.headers["Referrer-Policy"] == "same-origin"

    # Cancel a delayed job
    body = {"reportId": unique(), "rows": 5, "runAt": in_seconds(30 * 86_400)}
    delayed = site.api("POST", "/reports/scheduled", **body)["jobId"]
    browser.get(f"{site.url}/ui/jobs/{delayed}")
    browser.find_element(By.CSS_SELECTOR, "#cancel-form button").click()
    wait(browser, seen.alert_is_present()).accept()
    assert "Cancelled" in no_refusal(browser)
    assert wait_state(delayed, "cancelled")["state"] == "cancelled"

    # Retry a failed job, with a reason
    failed = add(
        "test.always_fails",
        {},
        queue="default",
        opts=JobOptions(attempts=1),
        owner=Owner(TENANT, "alice"),
    ).job_id
    wait_state(failed, "failed")
    browser.get(f"{site.url}/ui/jobs/{failed}")
    reason = "retried over https after the outage"
    form = browser.find_element(By.ID, "retry-form")
    form.find_element(By.NAME, "reason").send_keys(reason)
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait(browser, seen.text_to_be_present_in_element((By.ID, "audits"), reason))
    assert REFUSED not in browser.page_source

    # Resume a campaign (the operator's form on its page)
    campaign = site.api(
        "POST",
        "/campaigns",
        name="tls",
        category="c",
        template="t",
        recipientCount=1,
    )["campaignId"]
    browser.get(f"{site.url}/ui/campaigns/{campaign}")
    if not browser.find_elements(By.ID, "resume-form"):  # it finished already: the same form
        browser.execute_script(
            """
            const form = document.createElement("form");
            form.method = "post"; form.id = "resume-form";
            form.action = `/ui/campaigns/${arguments[0]}/resume`;
            const token = document.querySelector("input[name=csrf_token]").cloneNode();
            form.append(token, Object.assign(document.createElement("button"), {type: "submit"}));
            document.querySelector("main").append(form);
            """,
            campaign,
        )
    browser.find_element(By.CSS_SELECTOR, "#resume-form button").click()
    wait(browser, seen.url_to_be(f"{site.url}/ui/campaigns/{campaign}"))
    no_refusal(browser)

    # A scheduler: create, edit, remove
    scheduler_id = unique("tls-nightly")
    browser.get(f"{site.url}/ui/new-scheduler")
    form = browser.find_element(By.ID, "scheduler-form")
    form.find_element(By.NAME, "id").send_keys(scheduler_id)
    form.find_element(By.NAME, "pattern").send_keys("0 0 1 1 *")
    data = form.find_element(By.NAME, "data")
    data.clear()
    data.send_keys('{"reportId": "yearly", "rows": 10}')
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(browser, seen.url_to_be(f"{site.url}/ui/schedulers/{scheduler_id}"))
    pattern = browser.find_element(By.NAME, "pattern")
    pattern.clear()
    pattern.send_keys("0 0 1 7 *")
    browser.find_element(By.CSS_SELECTOR, "#scheduler-form button[type=submit]").click()
    assert "saved" in no_refusal(browser)
    browser.find_element(By.CSS_SELECTOR, "#remove-form button").click()
    wait(browser, seen.alert_is_present()).accept()
    wait(browser, seen.url_to_be(f"{site.url}/ui/schedulers"))
    assert not browser.find_elements(By.CSS_SELECTOR, f'[data-scheduler-id="{scheduler_id}"]')
    assert scheduler_id not in str(site.api("GET", "/schedulers"))

    # Sign-out: the sign-in page, and the cookie it had is over for anyone who copied it
    browser.find_element(By.CSS_SELECTOR, ".who button").click()
    wait(browser, seen.url_to_be(f"{site.url}/ui/signin"))
    assert not browser.find_elements(By.CSS_SELECTOR, "header nav")
    replayed = requests.get(
        f"{site.url}/ui/jobs",
        cookies={"keel_session": signed_in},
        headers={"Accept": "text/html"},
        timeout=10,
        verify=site.ca,
    )
    assert replayed.status_code == 401 and 'id="signin"' in replayed.text
