"""The jobs page's filter form in a real headless Chromium, used as a person uses it.

The form's "any" choices are empty values, so clicking Filter without choosing
anything sends ``?queue=&state=&name=``: that must list the jobs, not refuse
the query.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen
from selenium.webdriver.support.ui import Select

from tests.support.browser import wait
from tests.support.client import bearer, unique

TENANT = unique("ui-filters")
ALICE = bearer(tenant=TENANT, user="alice")


def delayed_report(served) -> str:
    run_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    response = requests.post(
        f"{served.url}/api/v1/reports/scheduled",
        headers=ALICE,
        json={"reportId": unique(), "rows": 5, "runAt": run_at},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    return response.json()["jobId"]


def sign_in(browser, served) -> None:
    browser.get(served.link(TENANT, "alice"))
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "#job-filters")))


def click_filter(browser) -> None:
    browser.find_element(By.CSS_SELECTOR, "#job-filters button[type=submit]").click()
    wait(browser, seen.url_contains("queue="))


def test_filter_with_the_default_any_choices_lists_the_jobs(served, fresh_browser):
    browser = fresh_browser
    # Given alice's delayed job, and the jobs page with the filters left at "any"
    job_id = delayed_report(served)
    sign_in(browser, served)
    # When she clicks Filter without choosing anything (the form sends ?queue=&state=&name=)
    click_filter(browser)
    # Then the page lists her job (no 400 page), and the filter form is still there
    row = wait(
        browser, seen.presence_of_element_located((By.CSS_SELECTOR, f'[data-job-id="{job_id}"]'))
    )
    assert "delayed" in row.text
    assert not browser.find_elements(By.CSS_SELECTOR, "#error")
    # And the page's auto-refresh asks for the same listing, which answers too
    refresh = browser.find_element(By.ID, "jobs-table").get_attribute("data-refresh-url")
    assert refresh is not None and "queue=" not in refresh


def test_filter_with_one_choice_and_the_rest_at_any_narrows_the_list(served, fresh_browser):
    browser = fresh_browser
    # Given a delayed job of alice's
    job_id = delayed_report(served)
    sign_in(browser, served)
    # When she chooses the state "completed" only and clicks Filter
    Select(browser.find_element(By.CSS_SELECTOR, "select[name=state]")).select_by_value("completed")
    click_filter(browser)
    # Then the list is filtered (her delayed job is not in it), without an error page
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "#jobs-table")))
    assert not browser.find_elements(By.CSS_SELECTOR, "#error")
    assert job_id not in browser.page_source
    # And choosing "delayed" shows it
    Select(browser.find_element(By.CSS_SELECTOR, "select[name=state]")).select_by_value("delayed")
    browser.find_element(By.CSS_SELECTOR, "#job-filters button[type=submit]").click()
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, f'[data-job-id="{job_id}"]')))
