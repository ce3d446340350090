"""``keel.testing``: a project's own tests run real Keel jobs on a throwaway stack.

The project below is a user's: its own folder, a job module on Keel's app, a conftest
that enables the plugin, and a test that waits on its job with ``.get()``. It runs in a
pytest of its own, with no ``KEEL_*`` setting inherited from this suite.
"""

from __future__ import annotations

import pytest

from tests.support.user_project import run_pytest

pytestmark = pytest.mark.stack

CONFTEST = 'pytest_plugins = ["keel.testing"]\n'
JOBS = """
from tasks.celery import app


@app.task(bind=True, autoretry_for=(IOError,), retry_backoff=0.2, retry_jitter=False,
          max_retries=3, name="shop.confirm", queue="shop")
def confirm(self, order_id, fail_times=0):
    if self.request.retries < fail_times:
        raise IOError("mail server busy")
    return f"sent {order_id} after {self.request.retries} retries"
"""
TESTS = """
from shop_jobs import confirm
from tasks.jobs.observe.queries import get


def test_the_confirmation_is_sent_through_a_real_record(keel_worker):
    result = confirm.delay("order-1", fail_times=1)
    assert result.get(timeout=30) == "sent order-1 after 1 retries"
    record = get(result.id)
    assert (record.state, record.queue, record.attempts_made) == ("completed", "shop", 1)
"""


def test_a_projects_tests_run_real_jobs_with_the_plugin(tmp_path):
    files = {"conftest.py": CONFTEST, "shop_jobs.py": JOBS, "test_shop.py": TESTS}
    done = run_pytest(tmp_path, files)
    assert "1 passed" in done.stdout
    assert not list(tmp_path.glob(".keel*"))  # the stack lived in a temporary folder
