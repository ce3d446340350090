"""In Chromium: a job added from the dashboard's form runs and its page opens; a chord's body
page shows each part's state in its flow."""

from __future__ import annotations

from celery import chord
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen
from selenium.webdriver.support.ui import Select

from tasks.jobs import Owner, acting_as
from tasks.jobs.observe.queries import get
from tests.browser.conftest import SHOTS
from tests.support.browser import screenshot, wait
from tests.support.client import unique, wait_state
from tests.support.jobs import celery_add, celery_collect

TENANT = unique("ui-flows")


def sign_in(browser, served, user: str = "alice") -> None:
    browser.get(served.link(TENANT, user))
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "header nav")))


def test_a_job_added_from_the_form_runs_and_its_page_opens(
    worker, served, fresh_browser, screenshots
):
    browser = fresh_browser
    sign_in(browser, served)
    # Given the add-job page, opened from the jobs page, with test.form_fields picked
    browser.find_element(By.ID, "add-job").click()
    Select(browser.find_element(By.NAME, "name")).select_by_value("test.form_fields")
    browser.find_element(By.CSS_SELECTOR, "#type-form button").click()
    form = wait(browser, seen.presence_of_element_located((By.ID, "job-form")))
    # When alice fills the fields drawn from its schema and adds the job
    form.find_element(By.NAME, "data.title").send_keys("from the browser")
    form.find_element(By.NAME, "data.copies").send_keys("2")
    form.find_element(By.NAME, "data.urgent").click()
    Select(form.find_element(By.NAME, "data.color")).select_by_value("blue")
    SHOTS.append(screenshot(browser, screenshots, "add-job"))
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # Then her new job's page opens, and the job runs with the data she typed
    wait(browser, seen.presence_of_element_located((By.ID, "job")))
    job_id = browser.find_element(By.ID, "job").get_attribute("data-state-url").split("/")[-2]
    assert browser.current_url.endswith(f"/ui/jobs/{job_id}")
    done = wait_state(job_id, "completed")
    assert done["result"]["got"] == {
        "title": "from the browser",
        "copies": 2,
        "ratio": 0.5,  # the schema's default, filled in by the form
        "urgent": True,
        "color": "blue",
    }
    added = get(job_id)
    assert added is not None and (added.tenant_id, added.user_id) == (TENANT, "alice")
    wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "#job .state-completed")))


def test_a_chords_flow_shows_each_parts_state(worker, served, fresh_browser, screenshots):
    browser = fresh_browser
    # Given alice's chord of three parts, run to its end
    with acting_as(Owner(TENANT, "alice")):
        body = chord([celery_add.si(n, n) for n in range(3)])(celery_collect.s())
    parts = [part.id for part in body.parent.results]
    wait_state(body.id, "completed", timeout=60)
    sign_in(browser, served)
    # When she opens the body's page
    browser.get(f"{served.url}/ui/jobs/{body.id}")
    flow = wait(browser, seen.presence_of_element_located((By.ID, "flow")))
    SHOTS.append(screenshot(browser, screenshots, "chord-flow"))
    # Then its flow lists the parts in order, each completed, each a link to its page
    shown = flow.find_elements(By.CSS_SELECTOR, "#flow-chord-parts li")
    assert [li.get_attribute("data-job-id") for li in shown] == parts
    assert all(li.find_element(By.CSS_SELECTOR, ".state").text == "completed" for li in shown)
    shown[0].find_element(By.TAG_NAME, "a").click()
    wait(browser, seen.url_to_be(f"{served.url}/ui/jobs/{parts[0]}"))
