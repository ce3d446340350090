"""The queues page's charts in a real headless Chromium: real jobs run by a worker, their
ends counted into the queue history, and the charts of each range drawing them."""

from __future__ import annotations

import re

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.store import counts
from tests.browser.test_dashboard import shot, sign_in
from tests.support.browser import wait
from tests.support.client import unique, wait_state

TENANT = unique("ui-charts")
OTHER = unique("ui-charts-other")


def ends(tenant: str, name: str, n: int, state: str) -> None:
    jobs = [
        add(
            name, {"ms": 20}, queue="default", opts=JobOptions(attempts=1), owner=Owner(tenant, "a")
        )
        for _ in range(n)
    ]
    for job in jobs:
        wait_state(job.job_id, state)


def test_the_queues_page_charts_a_tenants_throughput_failures_and_times_per_range(
    worker, served, fresh_browser, screenshots
):
    browser = fresh_browser
    # Given 4 completed and 2 failed jobs of the tenant on "default", run by a worker, and
    # another tenant's 5
    ends(TENANT, "test.sleep", 4, "completed")
    ends(TENANT, "test.unrecoverable", 2, "failed")
    ends(OTHER, "test.sleep", 5, "completed")
    counts.compact()  # what any worker's maintenance does every few seconds
    sign_in(browser, served, tenant=TENANT, user="olga", roles=("operator",))
    browser.get_log("browser")  # what earlier pages logged (a signed-out page's 401)
    for span in ("hour", "day", "week"):
        # When the operator picks the range
        browser.get(f"{served.url}/ui/queues")
        browser.find_element(By.CSS_SELECTOR, f'.ranges a[data-range="{span}"]').click()
        wait(browser, seen.url_contains(f"range={span}"))
        card = browser.find_element(By.CSS_SELECTOR, '[data-queue="default"]')
        # Then each chart is drawn, and says its numbers (to a screen reader too)
        labels = {
            kind: card.find_element(
                By.CSS_SELECTOR, f'[data-chart="{kind}"] svg[role="img"]'
            ).get_attribute("aria-label")
            for kind in ("completed", "failed", "wait", "run")
        }
        assert labels["completed"] == f"default: 4 completed in the last {span}"
        assert labels["failed"] == f"default: 2 failed in the last {span}"
        assert re.fullmatch(
            rf"default: run time: average [\d.]+ m?s, max [\d.]+ m?s over 6 runs in the last {span}",  # noqa: E501
            labels["run"],
        )
        assert "over 6 runs" in labels["wait"]
        bars = card.find_elements(By.CSS_SELECTOR, '[data-chart="completed"] rect')
        assert len(bars) == {"hour": 12, "day": 48, "week": 28}[span]
        drawn = [b for b in bars if float(b.get_attribute("height")) > 0]
        assert drawn and all(b.size["height"] > 0 for b in drawn)  # rendered, not only in markup
        assert card.find_element(By.CSS_SELECTOR, '[data-chart="completed"] svg').size["width"] > 50
    shot(browser, screenshots, "queue-charts")
    assert not [
        entry
        for entry in browser.get_log("browser")
        if entry["level"] == "SEVERE" and "favicon" not in entry["message"]
    ], "the page logged errors (a CSP refusal, a script error)"
