"""Webhooks end to end (``tasks.jobs.end.webhook_events``, ``tasks.jobs.upkeep.webhook_delivery``):
a tenant's endpoint gets each of its jobs' ends once, signed, from a real worker; an endpoint
that is down gets them once it is back, none lost."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.intake.webhook_events import REFRESH_S
from tasks.jobs.model import webhooks
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import wait_for
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.usefixtures("worker")
URL = "/api/v1/webhooks"


def register(client, tenant: str, url: str, events: list[str]) -> dict:
    operator = bearer(tenant=tenant, user="olga", roles=("operator",))
    answer = client.post(URL, json={"url": url, "events": events}, headers=operator)
    assert answer.status_code == 201, answer.get_json()
    time.sleep(REFRESH_S + 0.5)  # every worker has read the new endpoint
    return answer.get_json()


def jobs_of(tenant: str, completing: int, failing: int) -> dict[str, str]:
    """``{job id: the state it ends in}`` of jobs added for ``tenant``."""
    owner = Owner(tenant, "alice")
    ends = {}
    for _ in range(completing):
        ends[add("test.echo", {"n": 1}, queue="default", owner=owner).job_id] = "completed"
    for _ in range(failing):
        opts = JobOptions(attempts=1)
        job = add("test.always_fails", {}, queue="default", opts=opts, owner=owner)
        ends[job.job_id] = "failed"
    return ends


def test_two_hundred_jobs_ends_are_each_delivered_once_signed(client):
    receiver = Receiver().start()
    try:
        tenant = unique("hooks")
        endpoint = register(client, tenant, receiver.url, ["job.completed", "job.failed"])
        # Given 150 jobs that complete and 50 that fail, of the tenant (and 5 of another)
        ends = jobs_of(tenant, 150, 50)
        others = jobs_of(unique("other"), 5, 0)
        # Then the endpoint gets 200 deliveries, one per job, of the right event
        assert wait_for(lambda: len(receiver.received()) >= 200, timeout=120)
        for job_id in [*ends, *others]:
            wait_state(job_id, "completed", "failed", timeout=60)
        time.sleep(1.0)  # a delivery sent twice would come now
        got = receiver.received()
        assert len(got) == 200, Counter(d.event["data"]["jobId"] for d in got).most_common(3)
        events = [d.event for d in got]
        assert {e["data"]["jobId"]: e["data"]["state"] for e in events} == ends
        assert all(e["type"] == f"job.{e['data']['state']}" for e in events)
        assert len({d.headers["Keel-Webhook-Id"] for d in got}) == 200
        failed = [e for e in events if e["type"] == "job.failed"]
        assert all(e["data"]["failedReason"] for e in failed)
        # each signed with the endpoint's secret, over the body as sent, just now
        now = int(time.time())
        for delivery in got:
            signature = delivery.headers[webhooks.SIGNATURE_HEADER]
            assert webhooks.verify(endpoint["secret"], signature, delivery.body, now, 120)
            assert not webhooks.verify("whsec_other", signature, delivery.body, now, 120)
        # and the deliveries are jobs of the tenant, listed per endpoint, each completed
        operator = bearer(tenant=tenant, user="olga", roles=("operator",))
        listed = client.get(f"{URL}/{endpoint['id']}/deliveries?limit=100", headers=operator)
        assert listed.status_code == 200
        assert {j["state"] for j in listed.get_json()["jobs"]} == {"completed"}
        # and one sent again arrives again, with the same Keel-Webhook-Id
        first = listed.get_json()["jobs"][0]["jobId"]
        again = client.post(f"{URL}/deliveries/{first}/resend", headers=operator)
        assert again.status_code == 202, again.get_json()
        wait_state(again.get_json()["jobId"], "completed", timeout=30)
        ids = Counter(d.headers["Keel-Webhook-Id"] for d in receiver.received())
        assert ids.most_common(1)[0][1] == 2 and sum(ids.values()) == 201
    finally:
        receiver.stop()


@pytest.mark.parametrize(
    "down_s",
    [pytest.param(5, id="5s"), pytest.param(30, id="30s", marks=pytest.mark.slow)],
)
def test_an_endpoint_down_gets_every_event_once_it_is_back(client, down_s):
    receiver = Receiver().start()
    tenant = unique("down")
    endpoint = register(client, tenant, receiver.url, ["job.completed"])
    receiver.stop()
    try:
        # Given the endpoint down while 10 jobs complete
        ends = jobs_of(tenant, 10, 0)
        for job_id in ends:
            wait_state(job_id, "completed", timeout=60)
        time.sleep(down_s)
        operator = bearer(tenant=tenant, user="olga", roles=("operator",))
        page = client.get(f"{URL}/{endpoint['id']}/deliveries", headers=operator).get_json()
        assert len(page["jobs"]) == 10
        assert all(j["attemptsMade"] >= 1 for j in page["jobs"]), page  # tried, and failed
        assert receiver.received() == []
    finally:
        receiver.start()  # back, on the same port
    try:
        # Then each arrives once it is back (retried with backoff, as jobs)
        assert wait_for(lambda: len(receiver.received()) >= 10, timeout=60 + down_s)
        time.sleep(1.0)
        got = [d.event["data"]["jobId"] for d in receiver.received()]
        assert sorted(got) == sorted(ends)
    finally:
        receiver.stop()


def test_a_tenants_pause_resume_and_finished_campaign_are_posted(client, sandbox):
    receiver = Receiver().start()
    try:
        tenant = unique("events")
        events = ["queue.paused", "queue.resumed", "campaign.finished"]
        register(client, tenant, receiver.url, events)
        operator = bearer(tenant=tenant, user="olga", roles=("operator",))
        # When the tenant's operator pauses and resumes its jobs on a queue
        assert client.post("/api/v1/queues/default/pause", headers=operator).status_code == 200
        assert client.post("/api/v1/queues/default/resume", headers=operator).status_code == 200
        # and sends a campaign of 3 messages, which finishes
        campaign = client.post(
            "/api/v1/campaigns",
            json={"name": "hooks", "category": "c", "template": "hi", "recipientCount": 3},
            headers=operator,
        )
        assert campaign.status_code == 202, campaign.get_json()
        campaign_id = campaign.get_json()["campaignId"]
        # Then the endpoint gets each event once, in the order they happened
        assert wait_for(lambda: len(receiver.received()) >= 3, timeout=120)
        time.sleep(1.0)
        got = [d.event for d in receiver.received()]
        assert [e["type"] for e in got] == events, got
        assert got[0]["data"] == {"queue": "default", "pausedBy": "olga"}
        assert got[1]["data"] == {"queue": "default", "resumedBy": "olga"}
        assert got[2]["data"]["campaignId"] == campaign_id
        assert got[2]["data"]["report"]["messages"] == 3
    finally:
        receiver.stop()
