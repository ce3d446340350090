"""``/api/v1/webhooks`` (``web.webhooks``): registering endpoints, who sees them, what is
refused (bad URLs, addresses of this machine or private networks), and deliveries that
cannot be made. Deliveries that are made: ``tests/integration/test_webhooks.py``."""

from __future__ import annotations

import socket

import pytest

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.intake.webhook_events import SUBSCRIPTIONS
from tasks.jobs.model.webhooks import WebhookRefused
from tasks.jobs.upkeep.webhook_delivery import post
from tasks.platform.config import reload_settings
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import wait_for
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.usefixtures("inline_worker")
URL = "/api/v1/webhooks"


def operator(tenant: str) -> dict:
    return bearer(tenant=tenant, user="olga", roles=("operator",))


def register(client, tenant: str, url: str = "https://hooks.example.com/keel", **more):
    body = {"url": url, "events": ["job.completed"], **more}
    return client.post(URL, json=body, headers=operator(tenant))


def test_an_operator_registers_lists_reads_and_removes_its_tenants_endpoints(client):
    tenant = unique("t")
    made = register(client, tenant, description="billing")
    assert made.status_code == 201, made.get_json()
    endpoint = made.get_json()
    assert endpoint["secret"].startswith("whsec_") and len(endpoint["secret"]) > 40
    assert endpoint["events"] == ["job.completed"] and endpoint["createdBy"] == "olga"
    # The secret is shown once: neither the list nor the endpoint's page shows it
    listed = client.get(URL, headers=operator(tenant)).get_json()["webhooks"]
    assert [e["id"] for e in listed] == [endpoint["id"]] and "secret" not in listed[0]
    one = client.get(f"{URL}/{endpoint['id']}", headers=operator(tenant)).get_json()
    assert one["description"] == "billing" and "secret" not in one
    # Another tenant's operator finds nothing; a user of the tenant is not allowed
    other = operator(unique("other"))
    assert client.get(f"{URL}/{endpoint['id']}", headers=other).status_code == 404
    assert client.delete(f"{URL}/{endpoint['id']}", headers=other).status_code == 404
    assert client.get(URL, headers=other).get_json()["webhooks"] == []
    assert client.get(URL, headers=bearer(tenant=tenant)).status_code == 403
    # Removed, it is gone
    assert client.delete(f"{URL}/{endpoint['id']}", headers=operator(tenant)).status_code == 204
    assert client.get(f"{URL}/{endpoint['id']}", headers=operator(tenant)).status_code == 404
    assert (
        client.get(f"{URL}/{endpoint['id']}/deliveries", headers=operator(tenant)).status_code
        == 404
    )


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "ftp://hooks.example.com/x", "events": ["job.completed"]}, "url"),
        ({"url": "https://user:pw@hooks.example.com/x", "events": ["job.completed"]}, "url"),
        ({"url": "https://hooks.example.com:99999/x", "events": ["job.completed"]}, "url"),
        ({"url": "http://10.1.2.3/hook", "events": ["job.completed"]}, "url"),
        ({"url": "http://169.254.169.254/latest", "events": ["job.completed"]}, "url"),
        ({"url": "http://[fd00::1]/hook", "events": ["job.completed"]}, "url"),
        ({"url": "http://0.0.0.0/hook", "events": ["job.completed"]}, "url"),
        ({"url": "https://hooks.example.com/x", "events": []}, "events"),
        ({"url": "https://hooks.example.com/x", "events": ["job.exploded"]}, "events.0"),
        ({"url": "https://hooks.example.com/x"}, "events"),
        ({"url": "https://hooks.example.com/x", "events": ["job.failed"], "x": 1}, "x"),
    ],
)
def test_a_refused_endpoint_is_400_naming_the_field(client, body, field):
    answer = client.post(URL, json=body, headers=operator(unique("t")))
    assert answer.status_code == 400, answer.get_json()
    assert field in [d["field"] for d in answer.get_json()["details"]], answer.get_json()


def test_this_machine_is_refused_unless_an_operator_allows_it(client, monkeypatch):
    tenant = unique("t")
    # The suite allows 127.0.0.0/8 (its receivers); without that, loopback is refused
    assert register(client, tenant, "http://127.0.0.1:9/hook").status_code == 201
    monkeypatch.setenv("KEEL_WEBHOOK_ALLOW", "")
    reload_settings()
    try:
        for url in ("http://127.0.0.1:9/hook", "http://localhost:9/hook", "http://[::1]:9/"):
            answer = register(client, tenant, url)
            assert answer.status_code == 400, (url, answer.get_json())
            assert "KEEL_WEBHOOK_ALLOW" in answer.get_json()["message"]
    finally:
        monkeypatch.undo()
        reload_settings()


def test_a_name_that_resolves_to_this_machine_is_refused_before_connecting(monkeypatch):
    # Given a receiver on 127.0.0.1 and a public-looking name that resolves to it (DNS
    # rebinding), with no network allowed
    receiver = Receiver().start()
    resolve = socket.getaddrinfo

    def rebound(host, *args, **kwargs):
        return resolve("127.0.0.1" if host == "hooks.example.com" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    monkeypatch.setenv("KEEL_WEBHOOK_ALLOW", "")
    reload_settings()
    try:
        url = f"http://hooks.example.com:{receiver.port}/hook"
        with pytest.raises(WebhookRefused, match="resolves to an address webhooks may not reach"):
            post(url, b"{}", {"Content-Type": "application/json"}, timeout_s=5)
        # Then nothing was sent, and the refusal does not tell the address (no network map)
        assert receiver.received() == []
        with pytest.raises(WebhookRefused) as refused:
            post(url, b"{}", {}, timeout_s=5)
        assert "127.0.0.1" not in str(refused.value)
    finally:
        monkeypatch.undo()
        reload_settings()
        receiver.stop()


def test_a_tenant_has_at_most_twenty_endpoints(client):
    tenant = unique("t")
    for n in range(20):
        assert register(client, tenant, f"https://hooks.example.com/{n}").status_code == 201
    refused = register(client, tenant, "https://hooks.example.com/21")
    assert refused.status_code == 429 and refused.get_json()["details"][0]["limit"] == 20


def test_deliveries_to_a_removed_endpoint_or_a_refusing_one_end_failed(client):
    tenant = unique("t")
    receiver = Receiver(status=500).start()
    try:
        endpoint = register(client, tenant, receiver.url).get_json()
        SUBSCRIPTIONS.forget()  # this process's worker reads the new endpoint at once
        job = add("test.echo", {"n": 1}, queue="default", owner=Owner(tenant, "alice")).job_id
        wait_state(job, "completed", timeout=30)
        listing = f"{URL}/{endpoint['id']}/deliveries"

        def listed() -> list[dict]:
            return client.get(listing, headers=operator(tenant)).get_json()["jobs"]

        [delivery] = [d["jobId"] for d in wait_for(listed, timeout=30)]
        # The endpoint answers 500: the delivery is tried again, its failure says so
        retried = wait_state(delivery, "delayed", "failed", timeout=30)
        assert retried["failedReason"].endswith("answered 500: ok"), retried
        assert len(receiver.received()) >= 1
        # Removed, the delivery's next try ends it failed, without more tries
        client.delete(f"{URL}/{endpoint['id']}", headers=operator(tenant))
        failed = wait_state(delivery, "failed", timeout=30)
        assert failed["failedReason"] == f"webhook endpoint {endpoint['id']} was removed"
    finally:
        receiver.stop()


def test_a_job_retried_by_hand_posts_its_second_end_too(client):
    tenant = unique("t")
    receiver = Receiver().start()
    try:
        register(client, tenant, receiver.url, events=["job.failed"])
        SUBSCRIPTIONS.forget()
        opts = JobOptions(attempts=1)
        job = add("test.always_fails", {}, queue="default", opts=opts, owner=Owner(tenant, "al"))
        wait_state(job.job_id, "failed", timeout=30)
        assert wait_for(lambda: len(receiver.received()) == 1, timeout=30)
        # When an operator retries it and it fails again
        retried = client.post(
            f"/api/v1/jobs/{job.job_id}/retry",
            json={"reason": "the provider is back now"},
            headers=operator(tenant),
        )
        assert retried.status_code == 202, retried.get_json()
        assert wait_for(lambda: len(receiver.received()) == 2, timeout=30)
        # Then each end was posted, as events of their own
        ids = {d.headers["Keel-Webhook-Id"] for d in receiver.received()}
        assert len(ids) == 2
        assert {d.event["data"]["jobId"] for d in receiver.received()} == {job.job_id}
    finally:
        receiver.stop()
