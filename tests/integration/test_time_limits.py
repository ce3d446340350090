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


def test_a_call_s_own_soft_time_limit_reaches_the_handler_and_every_retry_of_it():
    # Given a task that declares no time limit, called with soft_time_limit=1, whose first
    # run asks for a retry (the retry is published again from the record)
    result = test_jobs.nap.apply_async(args=(8,), kwargs={"retry_first": True}, soft_time_limit=1)
    # Then the retried run was interrupted after about a second, not after its 8 s nap
    job = wait_state(result.id, "completed", "failed", timeout=20)
    assert job["state"] == "completed", job
    assert job["result"]["interrupted"] is True and 0.5 <= job["result"]["after"] < 6, job
    assert job["attemptsStarted"] == 2, job
