"""The dashboard in a real headless Chromium: sign-in, jobs, recovery, isolation, campaigns, docs.

The pages are driven as a person would use them (links, forms, confirm
dialogs); what they show is checked against the job records and the API.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import requests
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen

from tasks.jobs import JobOptions, Owner, add
from tests.browser.conftest import SHOTS
from tests.support.browser import PHONE, screenshot, wait
from tests.support.client import bearer, record, unique, wait_state
from tests.support.stack import wait_for

TENANT = unique("ui-acme")
OTHER = unique("ui-globex")
ALICE = bearer(tenant=TENANT, user="alice")
OPERATOR = bearer(tenant=TENANT, user="olga", roles=("operator",))


def api(served, method: str, path: str, headers: dict, **body) -> dict:
    response = requests.request(
        method, f"{served.url}/api/v1{path}", headers=headers, json=body or None, timeout=10
    )
    assert response.status_code in (200, 202), response.text
    return response.json()


def in_seconds(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def delayed_report(served, headers: dict = ALICE, seconds: float = 30 * 86_400) -> str:
    body = {"reportId": unique(), "rows": 20, "runAt": in_seconds(seconds)}
    return api(served, "POST", "/reports/scheduled", headers, **body)["jobId"]


def sign_in(browser, served, tenant: str = TENANT, user: str = "alice", roles=()) -> None:
    browser.get(served.link(tenant, user, tuple(roles)))
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "header nav")))


def finished(campaign_id: str, timeout: float = 120) -> dict:
    from tasks.notifications import campaigns

    def done() -> dict | None:
        status = campaigns.describe(campaigns.get(campaign_id))
        return status if status["state"] == "completed" else None

    return wait_for(done, timeout=timeout, interval=0.3)


def shot(browser, screenshots, name: str) -> None:
    SHOTS.append(screenshot(browser, screenshots, name))


def texts(browser, selector: str) -> list[str]:
    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, selector)]


def text_of(driver, selector: str) -> str | None:
    """The text of the element ``selector`` finds, or ``None`` while it is not (yet) there."""
    try:
        return driver.find_element(By.CSS_SELECTOR, selector).text or None
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def test_a_ui_link_signs_in_once_and_the_jobs_page_lists_a_job_added_through_the_api(
    worker, served, fresh_browser, screenshots
):
    browser = fresh_browser
    # Given a report job added through the API by alice
    job_id = api(served, "POST", "/reports", ALICE, reportId=unique(), rows=30)["jobId"]
    wait_state(job_id, "completed")
    # When alice opens a link from `keel ui-link`
    link = served.link(TENANT, "alice")
    browser.get(link)
    # Then she lands on the jobs page, which lists the job, with counts per state
    wait(browser, seen.url_to_be(f"{served.url}/ui/jobs"))
    row = wait(
        browser, seen.presence_of_element_located((By.CSS_SELECTOR, f'[data-job-id="{job_id}"]'))
    )
    assert "report.generate" in row.text and "completed" in row.text
    completed = browser.find_element(By.CSS_SELECTOR, '.counts [data-state="completed"] b')
    assert int(completed.text) >= 1
    # And the session cookie is HttpOnly and SameSite=Strict
    [cookie] = [c for c in browser.get_cookies() if c["name"] == "keel_session"]
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    shot(browser, screenshots, "jobs")
    # And the link works once: opened again, it is refused on the sign-in page
    browser.delete_all_cookies()
    browser.get(link)
    message = wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "#signin .error")))
    assert "already used" in message.text


def test_the_jobs_list_filters_pages_and_refreshes_itself(worker, served, fresh_browser):
    browser = fresh_browser
    sign_in(browser, served)
    # Given the jobs page filtered to delayed jobs, one per page
    first = delayed_report(served)
    browser.get(f"{served.url}/ui/jobs?state=delayed&limit=1")
    assert texts(browser, "[data-job-id]") and first in browser.page_source
    # When a new delayed job is added, the page shows it without a reload (auto-refresh)
    browser.execute_script("window.keelMarker = 1")
    newest = delayed_report(served)
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, f'[data-job-id="{newest}"]')))
    assert browser.execute_script("return window.keelMarker") == 1
    # And the next page (the cursor) holds the older one
    browser.find_element(By.CSS_SELECTOR, "a[rel=next]").click()
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, f'[data-job-id="{first}"]')))
    # And filtering by a name nobody uses shows an empty state, not an error
    browser.get(f"{served.url}/ui/jobs?name=no.such.job")
    assert "No jobs match" in browser.find_element(By.CSS_SELECTOR, ".empty").text


def test_the_job_page_follows_progress_to_100_percent_live(
    worker, served, fresh_browser, screenshots
):
    browser = fresh_browser
    sign_in(browser, served)
    # Given a report job due in a few seconds, its page open while it waits
    job_id = delayed_report(served, seconds=3)
    browser.get(f"{served.url}/ui/jobs/{job_id}")
    state = browser.find_element(By.CSS_SELECTOR, '[data-field="state"]')
    assert state.text == "delayed"
    browser.execute_script("window.keelMarker = 1")
    # When it runs, the bar reaches 100 % and the state completed, without a reload
    wait(browser, lambda b: b.find_element(By.ID, "job-progress").get_attribute("value") == "100")
    wait(
        browser,
        seen.text_to_be_present_in_element((By.CSS_SELECTOR, '[data-field="state"]'), "completed"),
    )
    assert browser.execute_script("return window.keelMarker") == 1
    progress = browser.execute_script("return window.keelProgressSeen")
    assert progress[0] == 0 and progress[-1] == 100 and progress == sorted(progress), progress
    assert record(job_id)["state"] == "completed"
    assert "attempt 1" in browser.find_element(By.ID, "runs").text
    # And the cancel button, offered while it waited, is gone now that it ran
    assert not browser.find_element(By.ID, "actions").is_displayed()
    shot(browser, screenshots, "job")


def test_an_operator_retries_a_failed_job_with_a_reason_and_it_runs_again(
    worker, served, fresh_browser
):
    browser = fresh_browser
    # Given a failed job of the tenant
    job_id = add(
        "test.always_fails",
        {},
        queue="default",
        opts=JobOptions(attempts=1),
        owner=Owner(TENANT, "alice"),
    ).job_id
    wait_state(job_id, "failed")
    sign_in(browser, served, user="olga", roles=("operator",))
    browser.get(f"{served.url}/ui/jobs/{job_id}")
    assert "plain failure on run 1" in browser.find_element(By.ID, "failure").text
    # When the operator gives a reason too short, the API's rule is shown
    form = browser.find_element(By.ID, "retry-form")
    browser.execute_script(
        "arguments[0].removeAttribute('minlength')", form.find_element(By.NAME, "reason")
    )
    form.find_element(By.NAME, "reason").send_keys("short")
    form.find_element(By.CSS_SELECTOR, "button").click()
    # (read inside the wait: the page may still be replaced by the answer's redirect. The
    # flashed message is the alert: the failure card's reason is styled .flash.error too,
    # and on the page before the redirect it is the only one)
    error = wait(browser, lambda driver: text_of(driver, '.flash.error[role="alert"]'))
    assert "reason" in error and "10" in error
    assert record(job_id)["attemptsStarted"] == 1
    # And with a real reason the retry is audited and the job runs again
    reason = "the upstream outage is over, run it again"
    form = browser.find_element(By.ID, "retry-form")
    form.find_element(By.NAME, "reason").send_keys(reason)
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait(browser, seen.text_to_be_present_in_element((By.ID, "audits"), reason))
    assert "olga" in wait(browser, lambda driver: text_of(driver, "#audits"))
    wait(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, "#runs li")) == 3)
    # (#runs is re-rendered live: read it inside a wait)
    assert "manual retry" in wait(browser, lambda driver: text_of(driver, "#runs"))
    after = wait_state(job_id, "failed")
    assert len(after["runs"]) == 3 and after["attemptsStarted"] == 1


def test_cancelling_a_delayed_job_makes_it_cancelled(worker, served, fresh_browser):
    browser = fresh_browser
    job_id = delayed_report(served)
    sign_in(browser, served)
    browser.get(f"{served.url}/ui/jobs/{job_id}")
    browser.find_element(By.CSS_SELECTOR, "#cancel-form button").click()
    wait(browser, seen.alert_is_present()).accept()
    # The answer's page says so (wait for it there: the old page's live refresh may show
    # the new state before the browser has left it)
    flash = wait(browser, lambda driver: text_of(driver, ".flash.ok"))
    assert "Cancelled" in flash
    assert "cancelled" in browser.find_element(By.CSS_SELECTOR, '[data-field="state"]').text
    assert record(job_id)["state"] == "cancelled"
    assert not browser.find_element(By.ID, "cancel-form").is_displayed()


def test_an_operator_creates_edits_and_removes_a_scheduler(served, fresh_browser, drop_schedulers):
    browser = fresh_browser
    drop_schedulers.append(TENANT)
    sign_in(browser, served, user="olga", roles=("operator",))
    scheduler_id = unique("nightly")
    # When the operator fills in the form with a template the API refuses
    browser.get(f"{served.url}/ui/new-scheduler")
    form = browser.find_element(By.ID, "scheduler-form")
    form.find_element(By.NAME, "id").send_keys(scheduler_id)
    form.find_element(By.NAME, "pattern").send_keys("0 0 1 1 *")
    data = form.find_element(By.NAME, "data")
    data.clear()
    data.send_keys('{"tenantId": "someone-else"}')
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    error = wait(browser, seen.presence_of_element_located((By.ID, "form-error")))
    assert "identity comes from the scheduler's owner" in error.text
    # Then with good data it is saved, with its next fire time
    data = browser.find_element(By.NAME, "data")
    data.clear()
    data.send_keys('{"reportId": "yearly", "rows": 10}')
    browser.find_element(By.CSS_SELECTOR, "#scheduler-form button[type=submit]").click()
    wait(browser, seen.url_to_be(f"{served.url}/ui/schedulers/{scheduler_id}"))
    assert (
        "next" in browser.page_source
        and f"{datetime.now(UTC).year + 1}-01-01" in browser.page_source
    )
    # And an edit changes its rule
    pattern = browser.find_element(By.NAME, "pattern")
    pattern.clear()
    pattern.send_keys("0 0 1 7 *")
    browser.find_element(By.CSS_SELECTOR, "#scheduler-form button[type=submit]").click()
    wait(browser, seen.text_to_be_present_in_element((By.CSS_SELECTOR, ".flash.ok"), "saved"))
    browser.get(f"{served.url}/ui/schedulers")
    row = browser.find_element(By.CSS_SELECTOR, f'[data-scheduler-id="{scheduler_id}"]')
    assert "0 0 1 7 *" in row.text
    # And removing it leaves it out of the list
    row.find_element(By.TAG_NAME, "a").click()
    browser.find_element(By.CSS_SELECTOR, "#remove-form button").click()
    wait(browser, seen.alert_is_present()).accept()
    wait(browser, seen.url_to_be(f"{served.url}/ui/schedulers"))
    assert not browser.find_elements(By.CSS_SELECTOR, f'[data-scheduler-id="{scheduler_id}"]')


def test_another_tenant_sees_nothing_of_tenant_a(
    worker, sandbox, served, fresh_browser, drop_schedulers
):
    browser = fresh_browser
    drop_schedulers.extend([TENANT, OTHER])
    # Given a job, a scheduler and a campaign of tenant A
    job_id = delayed_report(served, headers=OPERATOR)
    scheduler_id = unique("a-sched")
    template = {"name": "report.generate", "data": {"reportId": "y", "rows": 1}}
    api(
        served,
        "PUT",
        f"/schedulers/{scheduler_id}",
        OPERATOR,
        pattern="0 0 1 1 *",
        template=template,
    )
    campaign = api(
        served,
        "POST",
        "/campaigns",
        OPERATOR,
        name="a-only",
        category="c",
        template="t",
        recipientCount=1,
    )
    campaign_id = campaign["campaignId"]
    # When an operator of tenant B signs in
    sign_in(browser, served, tenant=OTHER, user="olga", roles=("operator",))
    # Then no page lists A's objects
    for page in ("jobs", "schedulers", "campaigns", "queues", "jobs?state=delayed"):
        browser.get(f"{served.url}/ui/{page}")
        for secret in (job_id, scheduler_id, campaign_id, TENANT, "a-only"):
            assert secret not in browser.page_source, f"/ui/{page} shows {secret}"
    # And A's objects' pages are "not found", exactly like missing ones
    for path in (f"jobs/{job_id}", f"schedulers/{scheduler_id}", f"campaigns/{campaign_id}"):
        browser.get(f"{served.url}/ui/{path}")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Not found", path
    # And the endpoints the pages fetch answer 404 too
    fetched = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const urls = arguments[0];
        Promise.all(urls.map(u => fetch(u).then(r => r.status))).then(done);
        """,
        [f"/ui/jobs/{job_id}/state", f"/ui/jobs/{job_id}/events"],
    )
    assert fetched == [404, 404]
    table = browser.execute_async_script(
        "const done = arguments[0]; fetch('/ui/jobs/table').then(r => r.text()).then(done);"
    )
    assert job_id not in table


def test_a_forged_or_expired_cookie_shows_the_sign_in_page(served, fresh_browser):
    browser = fresh_browser
    # A forged cookie
    browser.add_cookie(
        {"name": "keel_session", "value": "eyJrZWVsIjp7InRlbmFudCI6ImFjbWUifX0.forged"}
    )
    browser.get(f"{served.url}/ui/jobs")
    assert browser.find_elements(By.ID, "signin") and not browser.find_elements(
        By.CSS_SELECTOR, "header nav"
    )
    # A cookie signed by the app but past its expiry
    signer = served.app.session_interface.get_signing_serializer(served.app)
    old = {"keel": {"tenant": TENANT, "user": "alice", "roles": [], "exp": int(time.time()) - 1}}
    browser.add_cookie({"name": "keel_session", "value": signer.dumps(old)})
    browser.get(f"{served.url}/ui/jobs")
    assert "expired" in browser.find_element(By.CSS_SELECTOR, "#signin .error").text


def test_a_post_without_the_csrf_token_is_refused(worker, served, fresh_browser):
    browser = fresh_browser
    job_id = delayed_report(served)
    sign_in(browser, served)
    cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
    url = f"{served.url}/ui/jobs/{job_id}/cancel"
    without = requests.post(url, cookies=cookies, timeout=10, allow_redirects=False)
    wrong = requests.post(
        url, cookies=cookies, data={"csrf_token": "x"}, timeout=10, allow_redirects=False
    )
    assert (without.status_code, wrong.status_code) == (400, 400)
    assert without.json()["error"] == "csrf_failed"
    assert record(job_id)["state"] == "delayed"


def test_a_finished_campaign_shows_its_generations_and_four_invariants_passing(
    worker, sandbox, served, fresh_browser, screenshots
):
    browser = fresh_browser
    recipients = [{"to": f"+82-10-1111-{n:04d}", "vars": {"name": f"u{n}"}} for n in range(150)]
    campaign = api(
        served,
        "POST",
        "/campaigns",
        OPERATOR,
        name="spring sale",
        category="marketing",
        template="Hi {name}!",
        recipients=recipients,
        chunkSize=100,
    )
    finished(campaign["campaignId"])
    sign_in(browser, served, user="olga", roles=("operator",))
    browser.get(f"{served.url}/ui/campaigns/{campaign['campaignId']}")
    generations = browser.find_elements(By.CSS_SELECTOR, "#generations tbody tr")
    assert len(generations) >= 1 and "150" in browser.find_element(By.ID, "generations").text
    checks = browser.find_elements(By.CSS_SELECTOR, "#invariants li")
    assert [c.get_attribute("class") for c in checks] == ["pass"] * 4
    assert "4/4 pass" in browser.page_source
    shot(browser, screenshots, "campaign")
    browser.get(f"{served.url}/ui/campaigns")
    assert campaign["campaignId"][:10] in browser.page_source


def test_the_queues_page_counts_jobs_per_state_and_links_to_flower(
    worker, served, fresh_browser, screenshots, monkeypatch
):
    from tasks.platform.config import reload_settings

    browser = fresh_browser
    # Flower's address comes from configuration (web.hosts), never from the Host header
    monkeypatch.setenv("KEEL_FLOWER_URL", "http://127.0.0.1:5555/")
    reload_settings()
    delayed_report(served, headers=OPERATOR)
    sign_in(browser, served, user="olga", roles=("operator",))
    browser.get(f"{served.url}/ui/queues")
    reports = browser.find_element(By.CSS_SELECTOR, '[data-queue="reports"]')
    assert int(reports.find_element(By.CSS_SELECTOR, '[data-state="delayed"] b').text) >= 1
    assert browser.find_element(By.LINK_TEXT, "Flower ↗").get_attribute("href").endswith(":5555/")
    shot(browser, screenshots, "queues")
    monkeypatch.undo()
    reload_settings()


def test_pages_fit_a_phone_screen(served, fresh_browser, screenshots):
    browser = fresh_browser
    sign_in(browser, served, user="olga", roles=("operator",))
    shot(browser, screenshots, "jobs-operator")  # the tenant's jobs of this session, at 1280x800
    browser.set_window_size(*PHONE)
    browser.get_log("browser")  # what earlier pages logged
    for page in ("jobs", "queues", "schedulers", "campaigns", "new-scheduler"):
        browser.get(f"{served.url}/ui/{page}")
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth"
        )
        assert overflow <= 1, f"/ui/{page} is {overflow}px wider than a phone"
    # And no page broke its script or its own Content-Security-Policy
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    browser.get(f"{served.url}/ui/jobs")
    shot(browser, screenshots, "jobs-phone")


def test_the_api_docs_page_renders_every_operation(served, fresh_browser, screenshots):
    browser = fresh_browser
    browser.get_log("browser")
    browser.get(f"{served.url}/api/v1/docs")
    document = requests.get(f"{served.url}/api/v1/openapi.json", timeout=10).json()
    documented = sum(len(item) for item in document["paths"].values())
    wait(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, ".opblock")) == documented)
    assert "/api/v1/jobs/{job_id}/retry" in browser.page_source
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # every asset served by the app, nothing refused by the CSP
    shot(browser, screenshots, "api-docs")


@pytest.fixture
def drop_schedulers():
    from tasks.jobs.schedule import schedulers

    tenants: list[str] = []
    yield tenants
    for tenant in tenants:
        scope = schedulers.Scope(tenant_id=tenant)
        for found in schedulers.list_all(scope):
            schedulers.remove(scope, found.id)


class AttackerSite:
    """Another site (``localhost``, not ``127.0.0.1``: another origin and another site to the
    browser) whose page ``/go?to=URL`` sends the visitor's browser there (its script)."""

    def __init__(self) -> None:
        import json

        from werkzeug.wrappers import Request, Response

        @Request.application
        def app(request: Request) -> Response:
            target = json.dumps(request.args["to"])
            page = f"<!doctype html><p>cute cats</p><script>location.href = {target};</script>"
            return Response(page, content_type="text/html")

        from tests.support.browser import ServedApp

        self.served = ServedApp(app).start()  # type: ignore[arg-type]

    def send(self, browser, url: str) -> None:
        from urllib.parse import quote

        browser.get(f"http://localhost:{self.served.port}/go?to={quote(url, safe='')}")

    def stop(self) -> None:
        self.served.stop()


@pytest.fixture
def attacker():
    site = AttackerSite()
    yield site
    site.stop()


def session_payload(browser) -> str:
    """The session cookie's signed content, without the time it was signed at.

    Flask signs a permanent session again on every response (``SESSION_REFRESH_EACH_REQUEST``):
    the same session's cookie differs as soon as a second has passed, so a test that means
    "still the same session" compares this part (itsdangerous: ``payload.timestamp.signature``).
    """
    return browser.get_cookie("keel_session")["value"].rsplit(".", 2)[0]


def signed_in_as(browser, served) -> str:
    browser.get(f"{served.url}/ui/signin")
    return browser.find_element(By.CSS_SELECTOR, "#signin strong").text


def test_a_cross_site_redirect_to_another_users_link_leaves_the_operator_signed_in(
    served, fresh_browser, attacker
):
    browser = fresh_browser
    sign_in(browser, served, user="olga", roles=("operator",))
    before = session_payload(browser)
    # Given mallory's unused link, which another site redirects olga's browser to
    link = served.link(TENANT, "mallory", ("operator",))
    attacker.send(browser, link)
    # Then the page asks, naming mallory, and the browser keeps olga's session
    wait(browser, seen.presence_of_element_located((By.ID, "signin-confirm")))
    assert browser.find_element(By.ID, "wanted-user").text == "mallory"
    assert session_payload(browser) == before
    assert signed_in_as(browser, served) == "olga"
    # And the link is still unused: a person who wanted it goes on, and is asked again,
    # now seeing who she is (a same-origin page carries her session)
    attacker.send(browser, link)
    wait(browser, seen.element_to_be_clickable((By.ID, "continue"))).click()
    wait(browser, seen.presence_of_element_located((By.ID, "confirm-form")))
    assert browser.find_element(By.ID, "holder-user").text == "olga"
    browser.find_element(By.CSS_SELECTOR, "#confirm-form button").click()
    wait(browser, seen.url_to_be(f"{served.url}/ui/jobs"))
    assert signed_in_as(browser, served) == "mallory"


def test_a_link_pasted_while_signed_in_asks_before_switching(served, fresh_browser):
    browser = fresh_browser
    sign_in(browser, served, user="olga", roles=("operator",))
    browser.get(served.link(TENANT, "alice"))  # the address bar: Sec-Fetch-Site: none
    wait(browser, seen.presence_of_element_located((By.ID, "confirm-form")))
    assert browser.find_element(By.ID, "holder-user").text == "olga"
    browser.find_element(By.ID, "stay").click()
    wait(browser, seen.url_to_be(f"{served.url}/ui/jobs"))
    assert signed_in_as(browser, served) == "olga"


def test_after_sign_out_a_copied_cookie_reads_and_cancels_nothing(worker, served, fresh_browser):
    browser = fresh_browser
    job_id = delayed_report(served)
    sign_in(browser, served)
    browser.get(f"{served.url}/ui/jobs/{job_id}")
    copied = browser.get_cookie("keel_session")["value"]
    token = browser.find_element(By.CSS_SELECTOR, "#cancel-form input[name=csrf_token]")
    csrf = token.get_attribute("value")
    # When alice signs out
    browser.find_element(By.CSS_SELECTOR, ".who button").click()
    wait(browser, seen.url_to_be(f"{served.url}/ui/signin"))
    # Then her copied cookie and CSRF token read nothing and cancel nothing
    jar = {"keel_session": copied}
    page = requests.get(
        f"{served.url}/ui/jobs/{job_id}", cookies=jar, headers={"Accept": "text/html"}, timeout=10
    )
    assert page.status_code == 401 and 'id="signin"' in page.text and job_id not in page.text
    cancel = requests.post(
        f"{served.url}/ui/jobs/{job_id}/cancel",
        cookies=jar,
        data={"csrf_token": csrf},
        timeout=10,
        allow_redirects=False,
    )
    assert cancel.status_code == 401
    assert record(job_id)["state"] == "delayed"
    # And in the browser too
    browser.add_cookie({"name": "keel_session", "value": copied})
    browser.get(f"{served.url}/ui/jobs")
    assert browser.find_elements(By.ID, "signin") and not browser.find_elements(
        By.CSS_SELECTOR, "header nav"
    )
