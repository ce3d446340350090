"""Retries, backoff and unrecoverable failures against a real worker."""

from __future__ import annotations

import pytest

from tasks.jobs import Backoff, JobOptions, Owner, add
from tests.support.client import bearer, unique, wait_state, waits_between_runs

SLACK = 0.5
# Report jobs (docs/jobs.md) wait [0.5,1], [1,2], [2,4] s after the 1st, 2nd, 3rd failure.
WINDOWS = [(0.5, 1.0), (1.0, 2.0), (2.0, 4.0)]

pytestmark = pytest.mark.usefixtures("inline_worker")


def submit(client, **body) -> str:
    response = client.post(
        "/api/v1/reports", json={"reportId": unique(), "rows": 10, **body}, headers=bearer()
    )
    assert response.status_code == 202, response.get_json()
    return response.get_json()["jobId"]


@pytest.fixture(scope="module")
def failing(app, inline_worker) -> dict[int, str]:
    """Reports whose first N runs fail, submitted together when the module starts: their
    backoffs run side by side, and each test then reads its own job's timeline."""
    client = app.test_client()
    return {n: submit(client, failUntilAttempt=n) for n in (2, 3, 5)}


def assert_waits(job: dict, count: int) -> None:
    waits = waits_between_runs(job)
    assert len(waits) == count
    for wait, (low, high) in zip(waits, WINDOWS, strict=False):
        assert low - 0.05 <= wait <= high + SLACK, (waits, job["runs"])


def test_fail_until_attempt_2_completes_on_the_third_run(failing):
    # Given a report whose first two runs fail
    job_id = failing[2]
    # When the worker has retried it
    job = wait_state(job_id, "completed", "failed", timeout=30)
    # Then it completed on run 3, after waits within the backoff windows
    assert job["state"] == "completed"
    assert (job["attemptsMade"], job["attemptsStarted"]) == (2, 3)
    assert job["progress"] == {"step": "upload", "percent": 100}
    assert job["result"]["generatedRows"] == 10
    assert_waits(job, 2)


def test_fail_until_attempt_3_completes_on_the_fourth_run(failing):
    job_id = failing[3]
    job = wait_state(job_id, "completed", "failed", timeout=40)
    assert job["state"] == "completed"
    assert (job["attemptsMade"], job["attemptsStarted"]) == (3, 4)
    assert_waits(job, 3)


def test_fail_until_attempt_5_fails_after_four_runs(failing):
    job_id = failing[5]
    job = wait_state(job_id, "failed", "completed", timeout=40)
    assert job["state"] == "failed"
    assert (job["attemptsMade"], job["attemptsStarted"]) == (4, 4)
    assert "attempt 4" in job["failedReason"]
    assert job["result"] is None
    assert_waits(job, 3)


def test_a_job_without_handler_fails_at_once_as_unsupported():
    # Given a job name no worker knows, with attempts to spare
    added = add(
        "report.export",
        {"reportId": "x"},
        queue="reports",
        opts=JobOptions(attempts=4),
        owner=Owner("acme", "alice"),
    )
    # Then it fails on its first run, instead of vanishing or retrying
    job = wait_state(added.job_id, "failed", timeout=20)
    assert job["failedReason"] == "unsupported job: report.export"
    assert job["attemptsMade"] == 1


def test_a_plain_error_uses_every_attempt():
    added = add(
        "test.always_fails",
        {},
        queue="default",
        opts=JobOptions(attempts=4, backoff=Backoff(type="fixed", delay=100)),
    )
    job = wait_state(added.job_id, "failed", timeout=20)
    assert (job["attemptsMade"], job["attemptsStarted"]) == (4, 4)
    assert [run["attempt"] for run in job["runs"]] == [1, 2, 3, 4]
    assert job["failedReason"] == "plain failure on run 4"


def test_unrecoverable_error_fails_at_once_whatever_attempts_remain():
    added = add("test.unrecoverable", {}, queue="default", opts=JobOptions(attempts=4))
    job = wait_state(added.job_id, "failed", timeout=20)
    assert (job["attemptsMade"], job["attemptsStarted"]) == (1, 1)
    assert job["failedReason"] == "this input can never succeed"
