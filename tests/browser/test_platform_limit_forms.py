"""The platform role lowers a queue's concurrency in a real headless Chromium, through the
queues page's form, and sees the new limit shown as in force. (Every form's refusals and
the audit: ``tests/ui/test_platform_limit_forms.py``.)"""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as seen

from tasks.jobs.run import live_limits
from tests.browser.test_dashboard import shot
from tests.browser.test_platform_role import severe
from tests.support.browser import wait
from tests.support.client import unique

REASON = "vendor outage: one at a time until they recover"


def test_a_platform_user_lowers_a_queues_concurrency_and_sees_it_in_force(
    served, fresh_browser, screenshots
):
    browser, queue, user = fresh_browser, unique("ui-q"), unique("root")
    live_limits.set_limits(queue, {"concurrency": 4}, "cli:ops-anna", "a roomy start, four")
    card = f'section[data-queue="{queue}"]'
    try:
        # Given a platform session on the queues page, the queue at 4 at once
        browser.get(served.platform_link(user))
        wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, "header nav")))
        browser.get(f"{served.url}/ui/queues")
        shown = wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, card)))
        browser.get_log("browser")  # what earlier pages logged
        assert shown.find_element(By.CSS_SELECTOR, ".in-force").text == "4 at once"
        # When the user opens its form, lowers the concurrency to 1 and says why
        shown.find_element(By.CSS_SELECTOR, ".change-limits summary").click()
        form = shown.find_element(By.CSS_SELECTOR, "form.set-queue-limits")
        form.find_element(By.NAME, "concurrency").send_keys("1")
        form.find_element(By.NAME, "reason").send_keys(REASON)
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        # Then the page says it is in force, and its card shows it with who and why
        flash = wait(browser, seen.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
        assert flash.text == f"Queue {queue}: 1 at once in force on every worker within a second."
        shown = browser.find_element(By.CSS_SELECTOR, card)
        assert shown.find_element(By.CSS_SELECTOR, ".in-force").text == "1 at once"
        assert shown.find_element(By.CSS_SELECTOR, '[data-field="setBy"]').text == f"ui:{user}"
        assert shown.find_element(By.CSS_SELECTOR, '[data-field="reason"]').text == REASON
        shot(browser, screenshots, "platform-queue-limits")
        # And it is what every worker now admits by
        assert live_limits.effective(queue).concurrency == 1
        assert live_limits.history(queue)[0].actor == f"ui:{user}"
        assert not severe(browser), "the page logged errors (a CSP refusal, a script error)"
    finally:
        live_limits.clear_limits(queue, "cli:ops-anna", "the browser test is done")
