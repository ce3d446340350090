"""The platform role in a real headless Chromium: one session sees two tenants' jobs and the
key limit overrides, every view it opens is audited, and a tenant's operator — or a tenant's
session naming a "platform" role — sees its own tenant only."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.observe import platform_views
from tasks.jobs.run import live_key_limits
from tests.browser.test_dashboard import shot, sign_in, texts
from tests.support.browser import wait
from tests.support.client import unique

ACME, GLOBEX = unique("ui-acme"), unique("ui-globex")
REASON = "noisy partner: two at once until the vendor fixes retries"


def delayed(tenant: str) -> str:
    opts = JobOptions(delay=86_400_000, attempts=1)
    return add("test.echo", {}, queue="default", opts=opts, owner=Owner(tenant, "alice")).job_id


def severe(browser) -> list[str]:
    return [
        entry["message"]
        for entry in browser.get_log("browser")
        if entry["level"] == "SEVERE" and "favicon" not in entry["message"]
    ]


def test_a_platform_session_sees_two_tenants_and_the_overrides_and_is_audited(
    served, fresh_browser, screenshots
):
    browser = fresh_browser
    acme_job, globex_job = delayed(ACME), delayed(GLOBEX)
    live_key_limits.set_override(
        "test.keyed", GLOBEX, "vip-*", {"max_running": 2}, "cli:ops-anna", REASON
    )
    user = unique("root")
    try:
        # Given a platform session, signed in with the link `keel ui-link --platform` prints
        browser.get(served.platform_link(user))
        wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "header nav")))
        browser.get_log("browser")  # what earlier pages logged
        assert browser.find_element(By.ID, "platform-badge").text == "platform"
        # When it opens the jobs page: both tenants' jobs, each with its tenant
        browser.get(f"{served.url}/ui/jobs?queue=default&state=delayed")
        for tenant, job_id in ((ACME, acme_job), (GLOBEX, globex_job)):
            row = wait(
                browser,
                seen.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"]')),
            )
            assert row.find_element(By.CSS_SELECTOR, '[data-field="tenantId"]').text == tenant
        shot(browser, screenshots, "platform-jobs")
        # And the tenant filter narrows the list to one tenant
        field = browser.find_element(By.ID, "tenant-filter")
        field.send_keys(GLOBEX)
        browser.find_element(By.CSS_SELECTOR, "#job-filters button[type=submit]").click()
        wait(browser, seen.url_contains(f"tenant={GLOBEX}"))
        shown = [
            r.get_attribute("data-job-id")
            for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-job-id]")
        ]
        assert globex_job in shown and acme_job not in shown
        # And a job's page shows the job and offers no action
        browser.get(f"{served.url}/ui/jobs/{acme_job}")
        wait(
            browser, seen.presence_of_element_located((By.CSS_SELECTOR, '[data-field="tenantId"]'))
        )
        assert browser.find_element(By.CSS_SELECTOR, '[data-field="tenantId"]').text == ACME
        assert browser.find_elements(By.ID, "actions") == []
        # And the key limits page shows the override with who set it, when and why
        browser.find_element(By.LINK_TEXT, "Key limits").click()
        row = wait(
            browser,
            seen.presence_of_element_located(
                (By.CSS_SELECTOR, f'[data-job-type="test.keyed"] tr[data-tenant="{GLOBEX}"]')
            ),
        )
        assert row.find_element(By.CSS_SELECTOR, '[data-field="setBy"]').text == "cli:ops-anna"
        assert row.find_element(By.CSS_SELECTOR, '[data-field="reason"]').text == REASON
        assert row.find_element(By.TAG_NAME, "time").get_attribute("datetime")
        shot(browser, screenshots, "platform-key-limits")
        assert not severe(browser), "the pages logged errors (a CSP refusal, a script error)"
        # Then every page it opened is in the audit, with the user and the path
        audited = [(v.view, v.path) for v in platform_views.newest(user, 100)]
        assert ("ui.jobs", "/ui/jobs?queue=default&state=delayed") in audited
        assert any(v == "ui.jobs" and f"tenant={GLOBEX}" in p for v, p in audited)
        assert ("ui.job", f"/ui/jobs/{acme_job}") in audited
        assert ("ui.key_limits_page", "/ui/key-limits") in audited
    finally:
        live_key_limits.clear_override("test.keyed", GLOBEX, "vip-*", "cli:ops-anna", REASON)


def test_a_tenant_operator_sees_its_tenant_only_even_naming_a_platform_role(served, fresh_browser):
    browser = fresh_browser
    acme_job, globex_job = delayed(ACME), delayed(GLOBEX)
    # Given ACME's operator, whose session also names a role "platform"
    sign_in(browser, served, tenant=ACME, user="olga", roles=("operator", "platform"))
    browser.get_log("browser")
    # When she opens the jobs page: her tenant's job, not GLOBEX's, and no tenant column
    browser.get(f"{served.url}/ui/jobs?queue=default")
    wait(
        browser,
        seen.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-job-id="{acme_job}"]')),
    )
    assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{globex_job}"]') == []
    assert GLOBEX not in browser.page_source and "Tenant" not in texts(browser, "th")
    assert browser.find_elements(By.ID, "platform-badge") == []
    assert "Key limits" not in texts(browser, "header nav a")
    # And the platform role's page is refused to her, GLOBEX's job is not found
    browser.get(f"{served.url}/ui/key-limits")
    assert "platform role" in browser.find_element(By.TAG_NAME, "main").text
    browser.get(f"{served.url}/ui/jobs/{globex_job}")
    assert "not found" in browser.find_element(By.TAG_NAME, "main").text
    assert platform_views.newest("olga", 5) == []
