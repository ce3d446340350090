"""The generic jobs API: submit, read, list, cancel and retry jobs of any type.

Jobs run on a real Celery worker inside the test process (``inline_worker``)
against the module's own Postgres and the session's Redis.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from celery import shared_task
from sqlalchemy import func, select

from tasks.jobs import Deduplication, JobOptions, KeelTask, Owner, add
from tasks.jobs.model.models import RetryAudit
from tasks.jobs.observe.queue_counts import counts
from tasks.platform.db import transaction
from tests.support import events as job_events
from tests.support.client import bearer, metrics_headers, record, unique, wait_state
from tests.support.inline import join

pytestmark = pytest.mark.usefixtures("inline_worker")
URL = "/api/v1/jobs"
DAY_MS = 86_400_000
CELERY_STYLE = "test.args_echo"


@shared_task(name=CELERY_STYLE, base=KeelTask, queue="default", submittable=True)
def args_echo(*args, **kwargs) -> dict:
    """A Celery-style task (``run(*args, **kwargs)``) that tenants may submit."""
    return {"args": list(args), "kwargs": kwargs}


def assert_error(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error", "message", "details"}
    if field is not None:
        assert field in [d.get("field") for d in body["details"]], body
    return body


def submit(client, headers: dict, **body) -> dict:
    response = client.post(URL, json={"name": "test.echo", **body}, headers=headers)
    assert response.status_code == 202, response.get_data(as_text=True)
    return response.get_json()


def later(tenant: str, user: str = "alice", name: str = "test.echo", **opts) -> str:
    """A job of ``tenant``'s ``user`` that stays delayed for a day."""
    options = JobOptions(delay=DAY_MS, **opts)
    return add(name, {}, queue="default", opts=options, owner=Owner(tenant, user)).job_id


# --- submitting -----------------------------------------------------------------------------


def test_a_submitted_echo_job_runs_for_its_owner(client):
    # Given alice of a tenant
    headers = bearer(tenant=unique("t"), user="alice")
    # When she submits a test.echo job
    accepted = submit(client, headers, data={"greeting": "hello"})
    # Then it is accepted, and completes with its data echoed
    assert accepted["accepted"] is True and accepted["state"] == "waiting"
    assert accepted["statusUrl"] == f"{URL}/{accepted['jobId']}"
    done = join([accepted["jobId"]])[accepted["jobId"]]
    assert done["state"] == "completed"
    assert done["result"] == {"echo": {"greeting": "hello"}}
    # And its page shows what it was added with, and who owns it
    shown = client.get(accepted["statusUrl"], headers=headers).get_json()
    assert shown["data"] == {"greeting": "hello"} and shown["userId"] == "alice"
    assert shown["queue"] == "default" and shown["opts"]["attempts"] == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "test.sleep"}, "name"),  # registered, not submittable
        ({"name": "report.generate", "data": {"reportId": "r", "rows": 1}}, "name"),
        ({"name": "no.such.job"}, "name"),
        ({"name": "celery.backend_cleanup"}, "name"),
        ({"name": "test.echo", "data": {"tenantId": "other"}}, "data"),
        ({"name": "test.echo", "data": {"requested_by": "bob"}}, "data"),
        ({"name": "test.echo", "args": [1]}, "args"),  # a context-style handler
        ({"name": "test.echo", "kwargs": {"a": 1}}, "kwargs"),
        ({"name": "test.echo", "opts": {"jobId": "mine"}}, "opts.jobId"),
        ({"name": "test.echo", "opts": {"deduplication": {"id": "x"}}}, "opts.deduplication"),
        ({"name": "test.echo", "opts": {"attempts": 0}}, "opts.attempts"),
        ({"name": "test.echo", "opts": {"removeOnComplete": -1}}, "opts.removeOnComplete.bool"),
        ({"name": "test.echo", "opts": {"delay": 10 * 366 * DAY_MS + 1}}, "opts.delay"),
        (
            {
                "name": "test.echo",
                "opts": {"attempts": 60, "backoff": {"type": "exponential", "delay": 1000}},
            },
            "opts.backoff",
        ),
        ({"name": "test.echo", "tenant": "other"}, "tenant"),
        ({"name": "test.echo", "opts": {"concurrencyKey": ""}}, "opts.concurrencyKey"),
        ({"name": "test.echo", "opts": {"concurrencyKey": "k" * 201}}, "opts.concurrencyKey"),
        ({"name": "test.echo", "opts": {"concurrencyKey": 7}}, "opts.concurrencyKey"),
    ],
)
def test_a_refused_submission_is_400_naming_the_field(client, body, field):
    headers = bearer(tenant=unique("t"))
    response = client.post(URL, json=body, headers=headers)
    assert_error(response, 400, field)
    assert client.get(URL, headers=headers).get_json()["jobs"] == []


def test_a_celery_style_task_takes_args_and_kwargs_stored_as_delay_stores_them(client):
    # Given a delayed submission of a Celery-style task with positional and named arguments
    headers = bearer(tenant=unique("t"))
    body = {"args": [1, "two"], "kwargs": {"three": 3}, "opts": {"delay": DAY_MS}}
    accepted = submit(client, headers, name=CELERY_STYLE, **body)
    # Then the job's data is what .delay(1, "two", three=3) records
    shown = client.get(accepted["statusUrl"], headers=headers).get_json()
    assert shown["data"] == {"args": [1, "two"], "kwargs": {"three": 3}}
    # And identity cannot ride in the keyword arguments, nor data come with them
    refused = {"name": CELERY_STYLE, "kwargs": {"userId": "bob"}}
    assert_error(client.post(URL, json=refused, headers=headers), 400, "kwargs")
    both = {"name": CELERY_STYLE, "data": {}, "args": [1]}
    assert_error(client.post(URL, json=both, headers=headers), 400, "data")
    client.delete(accepted["statusUrl"], headers=headers)


def test_a_delay_past_the_tenant_quota_is_400_naming_the_limit(client):
    response = client.post(
        URL,
        json={"name": "test.echo", "opts": {"delay": 367 * DAY_MS}},
        headers=bearer(tenant=unique("t")),
    )
    body = assert_error(response, 400)
    assert body["details"][0]["limit"] == "maxDelaySeconds"


# --- cancelling -----------------------------------------------------------------------------


def test_a_cancelled_delayed_job_never_runs(client):
    # Given two delayed jobs of alice, due in 1.5 s
    headers = bearer(tenant=unique("t"))
    opts = {"delay": 1500}
    cancelled = submit(client, headers, data={"n": 1}, opts=opts)["jobId"]
    control = submit(client, headers, data={"n": 2}, opts=opts)["jobId"]
    # When she cancels one of them before it is due
    response = client.delete(f"{URL}/{cancelled}", headers=headers)
    # Then it is answered 200 with the job, cancelled
    assert response.status_code == 200, response.get_json()
    shown = response.get_json()
    assert shown["state"] == "cancelled" and shown["finishedOn"] is not None
    # And once the other job came due and completed, the cancelled one still never ran
    assert join([control])[control]["state"] == "completed"
    after = record(cancelled)
    assert after is not None and after["state"] == "cancelled"
    assert (after["attemptsStarted"], after["processedOn"], after["runs"]) == (0, None, [])
    # And a "cancelled" event says so
    assert "cancelled" in job_events.names("default", cancelled)


def test_cancelling_a_finished_job_is_409_and_changes_nothing(client):
    headers = bearer(tenant=unique("t"))
    job = submit(client, headers)["jobId"]
    done = join([job])[job]
    response = client.delete(f"{URL}/{job}", headers=headers)
    assert assert_error(response, 409)["error"] == "conflict"
    assert record(job) == done


def test_cancelling_a_failed_job_is_409(client):
    tenant = unique("t")
    job = add("test.unrecoverable", {}, queue="default", owner=Owner(tenant, "alice")).job_id
    join([job])
    response = client.delete(f"{URL}/{job}", headers=bearer(tenant=tenant))
    assert_error(response, 409)
    assert record(job)["state"] == "failed"


def test_cancelling_twice_answers_the_cancelled_job(client):
    tenant = unique("t")
    job = later(tenant)
    first = client.delete(f"{URL}/{job}", headers=bearer(tenant=tenant))
    second = client.delete(f"{URL}/{job}", headers=bearer(tenant=tenant))
    assert first.status_code == second.status_code == 200
    assert first.get_json() == second.get_json()
    assert job_events.names("default", job).count("cancelled") == 1


def test_another_tenants_or_users_job_is_404_exactly_like_a_missing_one(client):
    # Given a delayed job of tenant A's alice
    tenant = unique("t")
    job = later(tenant)
    missing = unique("missing")
    intruders = [
        bearer(tenant=unique("other"), user="alice", roles=("operator",)),
        bearer(tenant=tenant, user="bob"),
    ]
    for headers in intruders:
        for method in ("GET", "DELETE"):
            # When an intruder reads or cancels it, and a job that does not exist
            foreign = client.open(f"{URL}/{job}", method=method, headers=headers)
            absent = client.open(f"{URL}/{missing}", method=method, headers=headers)
            # Then both answers are the same 404
            assert foreign.status_code == absent.status_code == 404
            assert foreign.get_json() == absent.get_json()
    # And the job is untouched; the tenant's operator may cancel it
    assert record(job)["state"] == "delayed"
    operator = bearer(tenant=tenant, user="olga", roles=("operator",))
    assert client.delete(f"{URL}/{job}", headers=operator).get_json()["state"] == "cancelled"


def test_cancelling_frees_the_deduplication_id(client):
    tenant = unique("t")
    rule = Deduplication(id=unique("dedup"))
    first = later(tenant, deduplication=rule)
    assert later(tenant, deduplication=rule) == first  # deduplicated while it is live
    client.delete(f"{URL}/{first}", headers=bearer(tenant=tenant))
    assert later(tenant, deduplication=rule) != first


def test_retention_keeps_the_newest_cancelled_records_by_remove_on_fail(client):
    tenant = unique("t")
    jobs = [later(tenant, remove_on_fail=1) for _ in range(3)]
    for job in jobs:
        client.delete(f"{URL}/{job}", headers=bearer(tenant=tenant))
    # Trimming follows each commit: only the last cancelled record is kept
    assert [record(job) is not None for job in jobs] == [False, False, True]


def test_cancelled_jobs_are_counted_and_exported(client):
    tenant = unique("t")
    before = counts("default", tenant)["cancelled"]
    client.delete(f"{URL}/{later(tenant)}", headers=bearer(tenant=tenant))
    assert counts("default", tenant)["cancelled"] == before + 1
    metrics = client.get("/metrics", headers=metrics_headers()).get_data(as_text=True)
    assert 'keel_jobs{queue="default",state="cancelled"}' in metrics


def test_a_report_event_stream_ends_when_the_job_is_cancelled(client):
    # Given alice following the events of her scheduled report
    tenant = unique("t")
    headers = bearer(tenant=tenant)
    run_at = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    response = client.post(
        "/api/v1/reports/scheduled",
        json={"reportId": unique(), "rows": 3, "runAt": run_at},
        headers=headers,
    )
    job = response.get_json()["jobId"]
    seen: list[str] = []

    def follow() -> None:
        stream = client.get(f"/api/v1/reports/jobs/{job}/events?timeout=60", headers=headers)
        seen.append(stream.get_data(as_text=True))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    time.sleep(0.5)  # the stream is open and following
    # When she cancels the job
    assert client.delete(f"{URL}/{job}", headers=headers).status_code == 200
    # Then the stream ends with the cancelled event, long before its 60 s timeout
    follower.join(timeout=20)
    assert not follower.is_alive()
    assert seen[0].rstrip().split("event: ")[-1].startswith("cancelled")


# --- listing --------------------------------------------------------------------------------


def pages(client, headers: dict, limit: int, **filters) -> list[list[dict]]:
    found, cursor = [], None
    while True:
        params = {"limit": limit, **filters, **({"cursor": cursor} if cursor else {})}
        response = client.get(URL, query_string=params, headers=headers)
        assert response.status_code == 200, response.get_json()
        body = response.get_json()
        found.append(body["jobs"])
        cursor = body["nextCursor"]
        if cursor is None:
            return found


def test_25_jobs_page_through_in_3_pages_newest_first(client):
    # Given 25 jobs of one user
    tenant = unique("t")
    made = [later(tenant) for _ in range(25)]
    # When she pages through them 10 at a time
    seen = pages(client, bearer(tenant=tenant), limit=10)
    # Then 3 pages hold every job once, newest first
    assert [len(page) for page in seen] == [10, 10, 5]
    ids = [job["jobId"] for page in seen for job in page]
    assert sorted(ids) == sorted(made) and len(set(ids)) == 25
    # (createdAt is shown to the millisecond; two adds may share one, the order is the
    # records' own: the order they were made in, newest first)
    assert ids == made[::-1]
    shown = [job["createdAt"] for page in seen for job in page]
    assert shown == sorted(shown, reverse=True)


def test_jobs_added_while_paging_are_neither_skipped_nor_repeated(client):
    tenant = unique("t")
    headers = bearer(tenant=tenant)
    made = [later(tenant) for _ in range(6)]
    first = client.get(URL, query_string={"limit": 3}, headers=headers).get_json()
    newer = later(tenant)
    rest = client.get(
        URL, query_string={"limit": 3, "cursor": first["nextCursor"]}, headers=headers
    ).get_json()
    ids = [job["jobId"] for job in first["jobs"] + rest["jobs"]]
    assert sorted(ids) == sorted(made) and newer not in ids


def test_filters_and_scope(client):
    # Given alice's echo and sleep jobs, bob's echo job, and a cancelled one of alice's
    tenant = unique("t")
    echo = [later(tenant) for _ in range(2)]
    sleeper = later(tenant, name="test.sleep")
    bobs = later(tenant, user="bob")
    gone = later(tenant)
    client.delete(f"{URL}/{gone}", headers=bearer(tenant=tenant))

    def ids(headers: dict, **filters) -> set[str]:
        return {job["jobId"] for page in pages(client, headers, 100, **filters) for job in page}

    alice = bearer(tenant=tenant)
    operator = bearer(tenant=tenant, user="olga", roles=("operator",))
    # Then each filter selects what it names, and the scope is the caller's
    assert ids(alice) == {*echo, sleeper, gone}
    assert ids(alice, name="test.sleep") == {sleeper}
    assert ids(alice, state="cancelled") == {gone}
    assert ids(alice, state="delayed", name="test.echo") == set(echo)
    assert ids(alice, queue="reports") == set()
    assert ids(operator) == {*echo, sleeper, gone, bobs}
    assert ids(operator, state="delayed", name="test.echo") == {*echo, bobs}
    assert ids(bearer(tenant=unique("other"), roles=("operator",))) == set()


@pytest.mark.parametrize(
    "params, field",
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": 10**30}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"state": "done"}, "state"),
        ({"state": "Waiting"}, "state"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),  # base64 of "not-a-cursor"
        ({"cursor": "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgIlx1MDAwMCJd"}, "cursor"),  # NUL id
        ({"cursor": "!!"}, "cursor"),
        ({"queue": "a\x00b"}, "queue"),
        ({"color": "red"}, "color"),
    ],
)
def test_a_bad_query_is_400_naming_the_parameter(client, params, field):
    response = client.get(URL, query_string=params, headers=bearer())
    assert_error(response, 400, field)


def test_a_repeated_parameter_is_400(client):
    response = client.get(f"{URL}?state=waiting&state=failed", headers=bearer())
    assert_error(response, 400, "state")


# --- retrying -------------------------------------------------------------------------------


def test_an_operator_retries_a_failed_job_with_an_audit_row(client):
    # Given a failed job of tenant T
    tenant = unique("t")
    job = add("test.always_fails", {}, queue="default", owner=Owner(tenant, "alice")).job_id
    assert join([job])[job]["state"] == "failed"
    body = {"reason": "the downstream outage is over"}
    # When a user without the role asks for a retry, then T's operator
    refused = client.post(f"{URL}/{job}/retry", json=body, headers=bearer(tenant=tenant))
    operator = bearer(tenant=tenant, user="olga", roles=("operator",))
    response = client.post(f"{URL}/{job}/retry", json=body, headers=operator)
    # Then the user is refused with 403, the operator's retry accepted and audited first
    assert_error(refused, 403)
    assert response.status_code == 202, response.get_json()
    assert response.get_json()["statusUrl"] == f"{URL}/{job}"
    with transaction() as session:
        audits = session.scalars(select(RetryAudit).where(RetryAudit.job_id == job)).all()
    assert [(a.retried_by, a.reason, a.ids) for a in audits] == [
        ("olga", body["reason"], {"jobId": job, "name": "test.always_fails"})
    ]
    # And the job ran again from a fresh count, and failed again
    rerun = wait_state(job, "failed", timeout=30)
    assert (rerun["attemptsMade"], rerun["attemptsStarted"]) == (1, 1)


def test_retrying_a_job_that_is_not_failed_is_400(client):
    tenant = unique("t")
    job = later(tenant)
    response = client.post(
        f"{URL}/{job}/retry",
        json={"reason": "it is only delayed, though"},
        headers=bearer(tenant=tenant, roles=("operator",)),
    )
    assert assert_error(response, 400)["error"] == "invalid_state"


def test_a_report_retried_through_the_generic_api_keeps_the_reports_rules(client):
    # Given a report that failed for good, and the same report generated since
    tenant = unique("t")
    headers = bearer(tenant=tenant)
    report = {"reportId": unique(), "rows": 3}
    failed = client.post(
        "/api/v1/reports", json={**report, "failUntilAttempt": 5}, headers=headers
    ).get_json()["jobId"]
    assert wait_state(failed, "failed", timeout=40)["attemptsMade"] == 4
    done = client.post("/api/v1/reports", json=report, headers=headers).get_json()["jobId"]
    assert wait_state(done, "completed", timeout=30)["result"]["reused"] is False
    # When an operator retries the failed one through /api/v1/jobs
    response = client.post(
        f"{URL}/{failed}/retry",
        json={"reason": "is the report there yet?"},
        headers=bearer(tenant=tenant, user="olga", roles=("operator",)),
    )
    # Then it is refused as the reports endpoint refuses it: the report exists already
    assert assert_error(response, 409)["message"] == "the report for this operation already exists"
    with transaction() as session:
        audits = session.scalar(select(func.count()).where(RetryAudit.job_id == failed))
    assert audits == 0


def test_queue_counts_cover_every_queue_of_the_tenant_and_only_its_jobs(client):
    # Given a tenant with a completed job, a delayed one, and a cancelled one on "default",
    # and another tenant with jobs of its own
    tenant, other = unique("t"), unique("t")
    done = submit(client, bearer(tenant), name="test.echo", data={"n": 1})["jobId"]
    wait_state(done, "completed")
    later(tenant)
    cancelled = later(tenant)
    assert client.delete(f"{URL}/{cancelled}", headers=bearer(tenant)).status_code == 200
    later(other)
    # When its operator reads the queue counts
    answer = client.get("/api/v1/queues", headers=bearer(tenant, roles=("operator",)))
    # Then they are the tenant's own, per state, on the queue its jobs use
    assert answer.status_code == 200, answer.get_data(as_text=True)
    default = answer.get_json()["queues"]["default"]
    assert (default["completed"], default["delayed"], default["cancelled"]) == (1, 1, 1)
    assert default["waiting"] == default["failed"] == 0
    # And a user who is not an operator may not read them
    assert_error(client.get("/api/v1/queues", headers=bearer(tenant)), 403)
