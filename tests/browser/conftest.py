"""Browser tests: real headless Chromium against the app served on a real socket.

Screenshots of the main pages go to ``$KEEL_UI_SCREENSHOTS`` if set, else to a
folder of the test session's temporary directory (printed at the end).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.browser import DESKTOP, ServedApp, chromium

SHOTS: list[Path] = []


@pytest.fixture(scope="session")
def served(stack):
    from web import create_app

    app = ServedApp(create_app()).start()
    yield app
    app.stop()


@pytest.fixture(scope="session")
def browser(stack):
    driver = chromium()
    yield driver
    driver.quit()


@pytest.fixture
def fresh_browser(browser, served):
    """The session's Chromium signed out (no cookie of the app's), at desktop size; left on
    a blank page after the test, so a page that refreshes itself stops asking the app."""
    browser.set_window_size(*DESKTOP)
    browser.get(f"{served.url}/ui/signin")
    browser.delete_all_cookies()
    yield browser
    browser.get("about:blank")


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    given = os.environ.get("KEEL_UI_SCREENSHOTS")
    folder = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pytest_terminal_summary(terminalreporter) -> None:  # pragma: no cover - reporting only
    if SHOTS:
        terminalreporter.section("dashboard screenshots")
        for path in SHOTS:
            terminalreporter.write_line(str(path))
