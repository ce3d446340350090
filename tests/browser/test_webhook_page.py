"""The webhooks page in a real headless Chromium: an operator registers an endpoint through
the form, sees its secret once, finds it listed, and removes it."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen

from tests.support.browser import wait
from tests.support.client import unique

TENANT = unique("ui-webhooks")


def test_an_operator_registers_an_endpoint_and_sees_its_secret_once(served, fresh_browser):
    browser = fresh_browser
    browser.get(served.link(TENANT, "olga", ("operator",)))
    # Given the webhooks page, reached from the menu
    nav = wait(browser, seen.element_to_be_clickable((By.LINK_TEXT, "Webhooks")))
    nav.click()
    form = wait(browser, seen.presence_of_element_located((By.ID, "webhook-form")))
    # When the operator registers an endpoint for completed jobs (failed ones are ticked)
    form.find_element(By.NAME, "url").send_keys("http://127.0.0.1:9/browser")
    form.find_element(By.CSS_SELECTOR, 'input[value="job.completed"]').click()
    form.find_element(By.NAME, "description").send_keys("from the browser")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # Then the answer shows the secret, with the note to copy it now
    secret = wait(browser, seen.presence_of_element_located((By.ID, "secret"))).text
    assert secret.startswith("whsec_") and len(secret) > 40
    assert (
        "Copy it now, it is not shown again" in browser.find_element(By.ID, "webhook-secret").text
    )
    # And the list holds the endpoint, without the secret
    browser.find_element(By.LINK_TEXT, "all webhooks").click()
    row = wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "[data-webhook-id]")))
    assert "from the browser" in row.text and "job.completed, job.failed" in row.text
    assert secret not in browser.page_source
    # And its page does not show the secret either; removed (confirmed), it is gone
    row.find_element(By.TAG_NAME, "a").click()
    wait(browser, seen.presence_of_element_located((By.ID, "remove-form")))
    assert secret not in browser.page_source and not browser.find_elements(By.ID, "secret")
    browser.find_element(By.CSS_SELECTOR, "#remove-form button").click()
    wait(browser, seen.alert_is_present()).accept()
    wait(browser, seen.url_to_be(f"{served.url}/ui/webhooks"))
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-webhook-id]")
