"""Quotas, retention and fairness are per tenant: no tenant spends another's share.

Pass figures: the request one past each quota is refused (429, or 400 for a
shape limit) with ``details`` naming the limit, while another tenant is still
served; another tenant's traffic never trims my finished records; and with a
burst of 100 reports from one tenant queued first, another tenant's single
report finishes within 3x its time on an idle worker.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.observe.queries import get
from tasks.platform.config import reload_settings
from tasks.reports.jobs import GENERATE
from tasks.reports.operation_key import operation_key
from tasks.reports.service import report_options
from tests.security.conftest import record_figure
from tests.support.client import bearer, ts, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.usefixtures("stack")

SMALL = {
    "liveJobs": 5,
    "schedulers": 2,
    "campaignRecipients": 1000,
    "minChunkSize": 100,
    "maxDelaySeconds": 3600,
}


@pytest.fixture
def small_quotas() -> Iterator[dict[str, int]]:
    """The quotas above for this test (the API reads them per request), then the defaults."""
    previous = os.environ.get("KEEL_TENANT_QUOTAS")
    os.environ["KEEL_TENANT_QUOTAS"] = json.dumps(SMALL)
    reload_settings()
    yield SMALL
    if previous is None:
        os.environ.pop("KEEL_TENANT_QUOTAS", None)
    else:
        os.environ["KEEL_TENANT_QUOTAS"] = previous
    reload_settings()


def operator(tenant: str) -> dict[str, str]:
    return bearer(tenant=tenant, user="olga", roles=("operator",))


def soon(minutes: int = 30) -> str:
    return (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()


def schedule_report(client, tenant: str, minutes: int = 30):
    body = {"reportId": unique(), "rows": 5, "runAt": soon(minutes)}
    return client.post("/api/v1/reports/scheduled", json=body, headers=operator(tenant))


def campaign(client, tenant: str, count: int, **extra):
    body = {"name": "q", "category": "c", "template": "hi {seq}", "recipientCount": count, **extra}
    return client.post("/api/v1/campaigns", json=body, headers=operator(tenant))


def scheduler(client, tenant: str, scheduler_id: str, **template_opts):
    body = {
        "pattern": "0 0 1 1 *",
        "template": {
            "name": "report.generate",
            "data": {"reportId": "y", "rows": 5},
            **({"opts": template_opts} if template_opts else {}),
        },
    }
    return client.put(f"/api/v1/schedulers/{scheduler_id}", json=body, headers=operator(tenant))


def refused(response, status: int, limit: str) -> None:
    assert response.status_code == status, response.get_json()
    body = response.get_json()
    assert set(body) == {"error", "message", "details"}
    assert [d.get("limit") for d in body["details"]] == [limit], body


def test_each_quota_refuses_the_request_past_it_and_serves_other_tenants(
    client, small_quotas, drop_schedulers_of, sandbox
):
    greedy, calm = unique("greedy"), unique("calm")
    drop_schedulers_of.extend([greedy, calm])
    # Live jobs: 5 delayed reports are accepted, the 6th is 429 naming liveJobs
    assert [schedule_report(client, greedy).status_code for _ in range(5)] == [202] * 5
    refused(schedule_report(client, greedy), 429, "liveJobs")
    refused(
        client.post(
            "/api/v1/reports", json={"reportId": unique(), "rows": 1}, headers=operator(greedy)
        ),
        429,
        "liveJobs",
    )
    # Schedulers: 2 accepted, a 3rd is 429; updating one it holds still works
    assert scheduler(client, greedy, "s1").status_code == 200
    assert scheduler(client, greedy, "s2").status_code == 200
    refused(scheduler(client, greedy, "s3"), 429, "schedulers")
    assert scheduler(client, greedy, "s2").status_code == 200
    # Campaign recipients in unfinished campaigns: 600 + 500 > 1000 is 429
    assert campaign(client, greedy, 600, chunkSize=600).status_code == 202
    refused(campaign(client, greedy, 500, chunkSize=500), 429, "campaignRecipients")
    # Shape limits are 400: chunks smaller than the minimum, delays past the horizon
    refused(campaign(client, calm, 300, chunkSize=1), 400, "minChunkSize")
    refused(schedule_report(client, calm, minutes=61), 400, "maxDelaySeconds")
    refused(scheduler(client, calm, "far", delay=3_601_000), 400, "maxDelaySeconds")
    # And the other tenant is served meanwhile, within its own quotas
    assert schedule_report(client, calm).status_code == 202
    assert scheduler(client, calm, "s1").status_code == 200
    assert campaign(client, calm, 1000, chunkSize=500).status_code == 202
    record_figure(
        "tenant quotas",
        "liveJobs 5 → 6th 429, schedulers 2 → 3rd 429, "
        "campaignRecipients 1000 → +500 429, chunkSize 1 → 400, delay past 3600 s "
        "→ 400; the other tenant served 3/3",
    )


def test_submitted_jobs_are_held_to_the_tenants_quotas(client, small_quotas):
    # Given a tenant whose quota is 5 live jobs and delays of at most an hour
    greedy = unique("greedy")

    def submit(**opts):
        body = {"name": "test.echo", "data": {}, "opts": {"delay": 1_800_000, **opts}}
        return client.post("/api/v1/jobs", json=body, headers=operator(greedy))

    # When it submits 5 delayed jobs, then a 6th
    accepted = [submit() for _ in range(5)]
    assert [r.status_code for r in accepted] == [202] * 5
    # Then the 6th is 429 naming liveJobs, until one of the five is cancelled
    refused(submit(), 429, "liveJobs")
    first = accepted[0].get_json()["jobId"]
    assert client.delete(f"/api/v1/jobs/{first}", headers=operator(greedy)).status_code == 200
    assert submit().status_code == 202
    # And a delay, or a backoff wait, past the hour is 400 naming maxDelaySeconds
    other = unique("calm")
    body = {"name": "test.echo", "opts": {"delay": 3_601_000}}
    refused(client.post("/api/v1/jobs", json=body, headers=operator(other)), 400, "maxDelaySeconds")
    backoff = {"attempts": 2, "backoff": {"type": "fixed", "delay": 3_601_000}}
    body = {"name": "test.echo", "opts": backoff}
    refused(client.post("/api/v1/jobs", json=body, headers=operator(other)), 400, "maxDelaySeconds")
    # (the delayed jobs are not left for a session worker to run later)
    for job in client.get("/api/v1/jobs", headers=operator(greedy)).get_json()["jobs"]:
        client.delete(f"/api/v1/jobs/{job['jobId']}", headers=operator(greedy))


def test_the_live_job_quota_holds_under_concurrent_requests(app, small_quotas):
    """The count and the insert are serialised per tenant: ten racing requests, five accepted."""
    from concurrent.futures import ThreadPoolExecutor

    tenant = unique("racer")

    def post(_: int) -> int:
        return schedule_report(app.test_client(), tenant).status_code

    with ThreadPoolExecutor(max_workers=10) as pool:
        statuses = sorted(pool.map(post, range(10)))
    assert statuses == [202] * 5 + [429] * 5


def test_a_report_refused_at_the_quota_leaves_no_claim_on_its_operation_key(client, small_quotas):
    """The dedup claim and the quota check are one statement: refused, neither is kept."""
    tenant = unique("full")
    held = [schedule_report(client, tenant) for _ in range(5)]
    assert [r.status_code for r in held] == [202] * 5
    # When a report is submitted past the quota, it is refused with the count it met
    body = {"reportId": unique(), "rows": 7}
    refused_once = client.post("/api/v1/reports", json=body, headers=operator(tenant))
    refused(refused_once, 429, "liveJobs")
    assert refused_once.get_json()["details"][0]["current"] == 5
    # Then, a slot freed, the same request is a new job: nothing held its operation key
    first = held[0].get_json()["jobId"]
    assert client.delete(f"/api/v1/jobs/{first}", headers=operator(tenant)).status_code == 200
    accepted = client.post("/api/v1/reports", json=body, headers=operator(tenant))
    assert accepted.status_code == 202, accepted.get_json()
    assert accepted.get_json()["deduplicated"] is False
    # And a second identical request now is deduplicated against it
    again = client.post("/api/v1/reports", json=body, headers=operator(tenant)).get_json()
    assert again["deduplicated"] is True and again["jobId"] == accepted.get_json()["jobId"]
    for job in client.get("/api/v1/jobs", headers=operator(tenant)).get_json()["jobs"]:
        client.delete(f"/api/v1/jobs/{job['jobId']}", headers=operator(tenant))


@pytest.mark.usefixtures("worker")
def test_another_tenants_traffic_never_trims_my_finished_records(client):
    # Given tenant A's finished report
    mine, theirs = unique("keeper"), unique("busy")
    accepted = client.post(
        "/api/v1/reports", json={"reportId": unique(), "rows": 1}, headers=bearer(tenant=mine)
    ).get_json()
    wait_state(accepted["jobId"], "completed")
    # When tenant B posts 150 reports (its own retention keeps 100) and they all finish
    ids = [
        client.post(
            "/api/v1/reports", json={"reportId": unique(), "rows": 1}, headers=bearer(tenant=theirs)
        ).get_json()["jobId"]
        for _ in range(150)
    ]

    def states() -> list[str]:
        return [job.state if job else "trimmed" for job in map(get, ids)]

    finished = {"completed", "trimmed"}
    wait_for(lambda: set(states()) <= finished, timeout=120, interval=0.5)
    # Then A's job is still readable, and B's oldest records were trimmed to B's 100
    assert client.get(accepted["statusUrl"], headers=bearer(tenant=mine)).status_code == 200
    kept = [i for i in ids if get(i) is not None]
    assert len(kept) <= 100 and get(ids[-1]) is not None


@pytest.mark.stack
def test_system_jobs_are_trimmed_per_job_name(stack):
    """A busy system job (like the campaign monitor, keep 10) trims only its own records."""
    queue = unique("sysq")
    worker = WorkerProcess(stack.home, unique("sys"), queues=queue)
    worker.start()
    try:
        keep = JobOptions(remove_on_complete=2)
        quiet = add("test.sleep", {"ms": 0}, queue=queue, opts=keep).job_id
        wait_state(quiet, "completed")
        busy = [add("test.echo", {"i": i}, queue=queue, opts=keep).job_id for i in range(6)]

        def settled() -> bool:  # every busy job finished; the trimmed ones are gone
            jobs = [get(i) for i in busy]
            return all(j is None or j.state == "completed" for j in jobs)

        wait_for(settled, timeout=30)
        wait_for(lambda: sum(get(i) is not None for i in busy) == 2, timeout=10)
    finally:
        worker.stop()
    assert get(quiet) is not None  # another job name's record survived the busy one's trims


def finished_after_created(job_id: str) -> float:
    job = wait_state(job_id, "completed", timeout=120)
    return (ts(job["finishedOn"]) - ts(job["createdAt"])).total_seconds()


@pytest.mark.stack
def test_one_tenants_burst_does_not_starve_another_tenants_report(stack):
    # Given a worker of 3 processes on a queue of its own, where a report takes ~0.6 s
    queue = unique("fair")
    worker = WorkerProcess(
        stack.home,
        unique("fair"),
        concurrency=3,
        queues=queue,
        extra_env={"KEEL_REPORT_STEP_PAUSE_MS": "200"},
    )
    worker.start()
    a, b = Owner(unique("burst"), "alice"), Owner(unique("single"), "bob")

    def report(owner: Owner) -> str:
        report_id = unique()
        key = operation_key(owner.tenant_id, owner.user_id, report_id, 5)
        return add(
            GENERATE,
            {"reportId": report_id, "rows": 5},
            queue=queue,
            owner=owner,
            opts=report_options(key),
        ).job_id

    try:
        # B's report on the idle worker
        idle = finished_after_created(report(b))
        # When A queues a burst of 100 reports first, then B adds one
        burst = [report(a) for _ in range(100)]
        time.sleep(0.2)
        busy = finished_after_created(report(b))
        # (not started: waiting, or delayed in its tenant's line by the tenant's cap)
        waiting = sum(get(i).state in ("waiting", "delayed") for i in burst)
    finally:
        worker.stop(timeout=30)
    # Then B's report finished within 3x its idle time, with most of A's burst still waiting
    assert busy <= 3 * idle, f"idle {idle:.2f}s, behind a burst {busy:.2f}s"
    assert waiting >= 80
    record_figure(
        "fairness",
        f"B alone {idle:.2f}s; B after A's burst of 100: {busy:.2f}s "
        f"({busy / idle:.1f}x); {waiting} of A's still waiting",
    )
