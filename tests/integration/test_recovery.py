"""Manual retry with an audit trail, and its guards."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from tasks.jobs.model.models import RetryAudit
from tasks.platform.db import transaction
from tests.support.client import bearer, unique, wait_state

pytestmark = pytest.mark.usefixtures("inline_worker")
URL = "/api/v1/reports"
OPERATOR = {"roles": ("operator",)}
REASON = {"reason": "storage fixed, re-running the report"}


ROWS = 4


@pytest.fixture(scope="module")
def failing(app, inline_worker) -> list[tuple[str, str]]:
    """Reports that fail all 4 attempts, ``(job id, report id)``, submitted together when the
    module starts so that their backoffs run side by side; each test takes one."""
    client = app.test_client()
    pool = []
    for _ in range(6):
        report_id = unique()
        body = {"reportId": report_id, "rows": ROWS, "failUntilAttempt": 5}
        pool.append((client.post(URL, json=body, headers=bearer()).get_json()["jobId"], report_id))
    return pool


def failed_report(failing: list[tuple[str, str]]) -> tuple[str, str]:
    """One of the module's reports once it failed all 4 attempts: ``(job id, report id)``."""
    job_id, report_id = failing.pop()
    assert wait_state(job_id, "failed", timeout=40)["attemptsMade"] == 4
    return job_id, report_id


def failed_job(failing: list[tuple[str, str]]) -> str:
    return failed_report(failing)[0]


def audit_rows(job_id: str) -> list[RetryAudit]:
    with transaction() as session:
        return list(session.scalars(select(RetryAudit).where(RetryAudit.job_id == job_id)))


def retry(client, job_id: str, body=None, **who):
    return client.post(
        f"{URL}/jobs/{job_id}/retry", json=body or REASON, headers=bearer(**{**OPERATOR, **who})
    )


def test_retry_without_fixing_the_cause_runs_four_more_times(client, failing):
    # Given a job that failed all 4 attempts
    job_id = failed_job(failing)
    # When an operator retries it without fixing the cause
    response = retry(client, job_id)
    assert response.status_code == 202
    assert response.get_json() == {
        "jobId": job_id,
        "accepted": True,
        "statusUrl": f"{URL}/jobs/{job_id}",
    }
    # Then it runs 4 more times and fails again: 8 runs in all
    job = wait_state(job_id, "failed", timeout=40)
    assert (job["attemptsMade"], job["attemptsStarted"]) == (4, 4)
    assert sum(1 for run in job["runs"] if run.get("startedAt")) == 8
    # And one audit row holds the first failure
    [audit] = audit_rows(job_id)
    assert audit.failed_reason == "temporary storage failure on attempt 4"
    assert (audit.attempts_made, audit.attempts_started) == (4, 4)
    assert audit.retried_by == "alice" and audit.reason == REASON["reason"]
    assert set(audit.ids) == {"reportId", "rows", "operationKey"}
    assert audit.stacktrace and "TemporaryStorageFailure" in audit.stacktrace[-1]


def test_twenty_concurrent_retries_one_wins(app, failing):
    job_id = failed_job(failing)
    barrier = threading.Barrier(20)
    codes: list[int] = []

    def attempt() -> None:
        barrier.wait()
        codes.append(retry(app.test_client(), job_id).status_code)

    threads = [threading.Thread(target=attempt) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(codes) == [202] + [409] * 19
    assert len(audit_rows(job_id)) == 1


def test_retry_guards(client, failing):
    job_id = failed_job(failing)
    assert retry(client, job_id, roles=()).status_code == 403
    assert retry(client, job_id, tenant="globex").status_code == 404
    # (an operator of the same tenant may retry it: tests/security/test_tenant_scope.py)
    assert retry(client, "0" * 32).status_code == 404
    assert retry(client, job_id, body={"reason": "too short"}).status_code == 400
    assert audit_rows(job_id) == []

    done = client.post(URL, json={"reportId": unique(), "rows": 2}, headers=bearer())
    done_id = done.get_json()["jobId"]
    wait_state(done_id, "completed")
    not_failed = retry(client, done_id)
    assert not_failed.status_code == 400 and "completed" in not_failed.get_json()["message"]


def test_retry_is_refused_when_the_result_already_exists(client, failing):
    # Given a failed job, and then the same report produced by a later job
    failed_id, report_id = failed_report(failing)
    body = {"reportId": report_id, "rows": ROWS}
    later = client.post(URL, json=body, headers=bearer()).get_json()
    wait_state(later["jobId"], "completed")
    # Then retrying the failed one is a conflict, and nothing is audited
    response = retry(client, failed_id)
    assert response.status_code == 409
    assert audit_rows(failed_id) == []


def test_retry_is_refused_while_a_live_duplicate_runs(client, failing):
    failed_id, report_id = failed_report(failing)
    body = {"reportId": report_id, "rows": ROWS}
    live = client.post(URL, json={**body, "failUntilAttempt": 1}, headers=bearer()).get_json()
    assert live["deduplicated"] is False
    response = retry(client, failed_id)
    assert response.status_code == 409
    assert response.get_json()["details"] == [{"jobId": live["jobId"]}]


def test_the_audit_table_refuses_changes(client, failing):
    job_id = failed_job(failing)
    assert retry(client, job_id).status_code == 202
    for statement in (
        "UPDATE job_retry_audit SET reason = 'rewritten history'",
        "DELETE FROM job_retry_audit",
        "TRUNCATE job_retry_audit",
    ):
        with pytest.raises(DBAPIError, match="append-only"), transaction() as session:
            session.execute(text(statement))
    [audit] = audit_rows(job_id)
    assert audit.reason == REASON["reason"]
