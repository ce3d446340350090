"""A real headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by selenium,
and the app served on a real socket for it.

The app is this process's Flask app, served by werkzeug's threaded server in a
thread, against the suite's real Postgres and Redis; jobs are run by the
session's worker processes. Nothing is downloaded at run time: ``.ci/run``
installs the Debian packages on a machine that lacks them.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import Flask
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait
from werkzeug.serving import BaseWSGIServer, make_server

from keel.embedded import free_port
from web.ui.session import issue_link, issue_platform_link

CHROMIUM = os.environ.get("KEEL_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("KEEL_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
DESKTOP = (1280, 800)
PHONE = (390, 844)


def chromium(*extra: str) -> webdriver.Chrome:
    """Headless Chromium at 1280x800 (as root in CI: no sandbox; small /dev/shm: disk), with
    ``extra`` command-line switches (the TLS tier's: trust its throwaway certificate)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            raise RuntimeError(
                f"{path} is missing: apt-get install -y chromium chromium-driver (.ci/run does)"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
        *extra,
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    return driver


@dataclass
class ServedApp:
    """``app`` on 127.0.0.1:<free port>, one thread per request (event streams stay open)."""

    app: Flask
    port: int = field(default_factory=free_port)
    server: BaseWSGIServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServedApp:
        self.server = make_server("127.0.0.1", self.port, self.app, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def link(self, tenant: str, user: str, roles: tuple[str, ...] = (), ttl_s: int = 60) -> str:
        """A one-time sign-in URL, as ``keel ui-link`` prints it."""
        token = issue_link(self.app.config["SECRET_KEY"], tenant, user, list(roles), ttl_s)
        return f"{self.url}/ui/login/{token}"

    def platform_link(self, user: str, ttl_s: int = 60) -> str:
        """A one-time sign-in URL of the platform role, as ``keel ui-link --platform`` prints it."""
        token = issue_platform_link(self.app.config["SECRET_KEY"], user, ttl_s)
        return f"{self.url}/ui/login/{token}"


# chromedriver's words for an element read while its page was being replaced (a form just
# submitted): the same race as a stale element, reported as an "unknown error".
_REPLACED_NODE = "does not belong to the document"


def wait(driver: webdriver.Chrome, condition: Any, timeout: float = 30) -> Any:
    """``condition`` once it holds, polled every 0.1 s for at most ``timeout`` s.

    A check that reads the page being left after a submit (the old page's flash, say) may
    hit a node chromedriver has just dropped: that poll counts as "not yet", as selenium
    counts a stale element, and any other error still ends the wait.
    """

    def polled(driver_: webdriver.Chrome) -> Any:
        try:
            return condition(driver_)
        except StaleElementReferenceException:
            return False
        except WebDriverException as error:
            if _REPLACED_NODE in (error.msg or ""):
                return False
            raise

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(polled)


def screenshot(driver: webdriver.Chrome, folder: Path, name: str) -> Path:
    """Save the whole page (its full height at the current width) as ``name``.png."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    width = driver.get_window_size()["width"]
    height = driver.execute_script("return document.documentElement.scrollHeight")
    current = driver.get_window_size()
    driver.set_window_size(width, max(current["height"], min(int(height) + 120, 4000)))
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(current["width"], current["height"])
    return path
