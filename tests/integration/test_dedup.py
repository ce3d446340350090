"""Duplicate suppression (BullMQ's simple, throttle and debounce modes) and idempotent results."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from tasks.jobs import Deduplication, JobOptions, add
from tasks.jobs.model.models import JobRecord
from tasks.jobs.store.dedup import holder_of
from tasks.platform.db import transaction
from tasks.reports.operation_key import operation_key
from tests.support import events
from tests.support.client import bearer, unique, wait_state

pytestmark = pytest.mark.usefixtures("inline_worker")
URL = "/api/v1/reports"


def post(client, body, **who):
    response = client.post(URL, json=body, headers=bearer(**who))
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def records_for(report_id: str) -> int:
    with transaction() as session:
        return session.scalar(
            select(func.count()).where(JobRecord.data["reportId"].astext == report_id)
        )


def test_same_request_while_unfinished_returns_the_live_job(client):
    # Given a report job that is still running
    body = {"reportId": unique(), "rows": 7}
    first = post(client, body)
    # When the same principal asks again, and then with other rows
    second = post(client, body)
    other_rows = post(client, {**body, "rows": 8})
    # Then the duplicate got the live job, and other rows made a new job
    assert second["jobId"] == first["jobId"] and second["deduplicated"] is True
    assert other_rows["jobId"] != first["jobId"] and other_rows["deduplicated"] is False
    assert records_for(body["reportId"]) == 2
    kept = [e for e in events.of_job("reports", first["jobId"]) if e["event"] == "deduplicated"]
    assert kept and kept[0]["deduplicationId"] == operation_key(
        "acme", "alice", body["reportId"], 7
    )
    assert kept[0]["deduplicatedJobId"] != first["jobId"]


def test_after_completion_the_same_request_is_a_new_job_reusing_the_result(client):
    body = {"reportId": unique(), "rows": 9}
    first = post(client, body)
    assert wait_state(first["jobId"], "completed")["result"]["reused"] is False
    again = post(client, body)
    assert again["deduplicated"] is False and again["jobId"] != first["jobId"]
    job = wait_state(again["jobId"], "completed")
    assert job["result"]["reused"] is True
    assert job["result"]["objectKey"].startswith("reports/acme/")


def test_another_user_is_not_deduplicated_against_me(client):
    body = {"reportId": unique(), "rows": 3}
    mine = post(client, body)
    theirs = post(client, body, user="bob")
    assert theirs["jobId"] != mine["jobId"] and theirs["deduplicated"] is False


def test_fifty_concurrent_identical_submissions_make_one_job(app):
    # failing runs keep the first job unfinished (retrying) for seconds, so every
    # submission lands while it is live, however slowly the 50 threads get going
    body = {"reportId": unique(), "rows": 11, "failUntilAttempt": 3}
    barrier = threading.Barrier(50)
    answers: list[dict] = []

    def submit() -> None:
        client = app.test_client()
        barrier.wait()
        answers.append(client.post(URL, json=body, headers=bearer()).get_json())

    threads = [threading.Thread(target=submit) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({a["jobId"] for a in answers}) == 1
    assert sum(a["deduplicated"] for a in answers) == 49
    assert records_for(body["reportId"]) == 1


def test_simple_mode_frees_the_id_when_the_job_ends():
    rule = Deduplication(id=unique("dedup"))
    first = add("test.echo", {}, queue="default", opts=JobOptions(deduplication=rule))
    wait_state(first.job_id, "completed")
    with transaction() as session:
        assert holder_of(session, "default", rule.id) is None
    second = add("test.echo", {}, queue="default", opts=JobOptions(deduplication=rule))
    assert second.created and second.job_id != first.job_id


def test_throttle_mode_holds_the_id_for_its_ttl_even_after_completion():
    rule = Deduplication(id=unique("throttle"), ttl=1500)
    first = add("test.echo", {}, queue="default", opts=JobOptions(deduplication=rule))
    wait_state(first.job_id, "completed")
    during = add("test.echo", {}, queue="default", opts=JobOptions(deduplication=rule))
    assert (during.created, during.job_id) == (False, first.job_id)
    time.sleep(1.6)
    after = add("test.echo", {}, queue="default", opts=JobOptions(deduplication=rule))
    assert after.created and after.job_id != first.job_id


def test_debounce_replace_swaps_the_delayed_job_for_the_newest():
    rule = Deduplication(id=unique("debounce"), ttl=5000, extend=True, replace=True)
    first = add(
        "test.echo", {"n": 1}, queue="default", opts=JobOptions(delay=1500, deduplication=rule)
    )
    second = add(
        "test.echo", {"n": 2}, queue="default", opts=JobOptions(delay=1500, deduplication=rule)
    )
    assert second.created and second.job_id != first.job_id
    with transaction() as session:
        assert session.get(JobRecord, first.job_id) is None
        assert holder_of(session, "default", rule.id) == second.job_id
    assert wait_state(second.job_id, "completed", timeout=10)["result"] == {"echo": {"n": 2}}


def test_custom_job_id_is_unique():
    job_id = unique("custom")
    first = add("test.echo", {"n": 1}, queue="default", opts=JobOptions(job_id=job_id))
    second = add("test.echo", {"n": 2}, queue="default", opts=JobOptions(job_id=job_id))
    assert first.created and not second.created and second.job_id == job_id
    assert wait_state(job_id, "completed")["result"] == {"echo": {"n": 1}}
