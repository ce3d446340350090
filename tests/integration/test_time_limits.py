"""Celery's time limits on a Keel task, with a real prefork worker."""

from __future__ import annotations

import pytest

from tests.support import jobs as test_jobs
from tests.support.client import wait_state

pytestmark = pytest.mark.usefixtures("worker")


def test_a_soft_time_limit_raises_inside_the_handler_which_ends_cleanly():
    # Given a task declared with soft_time_limit=1 that would sleep 30 s
    result = test_jobs.soft_limited.delay(30)
    # Then Celery's SoftTimeLimitExceeded reached the handler after about a second, and the
    # handler's own ending (here: a clean return) is the run's, recorded once
    job = wait_state(result.id, "completed", "failed", timeout=20)
    assert job["state"] == "completed", job
    assert job["result"]["interrupted"] is True and 0.5 <= job["result"]["after"] < 10
    assert job["attemptsStarted"] == 1 and len(job["runs"]) == 1
