"""The dashboard's webhook pages: registering through the form shows the secret once, an
endpoint's deliveries are listed and sent again as the API does, and what the API refuses
(a private address, another tenant's endpoint, a user without the role) is refused here."""

from __future__ import annotations

import html
import re

import pytest

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.model import webhooks
from tasks.jobs.model.models import WebhookEndpoint
from tasks.jobs.observe.queries import get as job_record
from tasks.platform.db import transaction
from tests.support.client import bearer, unique
from tests.support.ui import PAGE, csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("webhook-pages")
OPERATOR = ("operator",)
API = bearer(tenant=TENANT, user="olga", roles=OPERATOR)
# Port 9 (discard) on this machine, which the tests' KEEL_WEBHOOK_ALLOW admits: nothing is
# sent in this module anyway (no worker runs, and deliveries are added delayed)
HOOK = "http://127.0.0.1:9/pages"
SECRET = re.compile(r"whsec_[\w-]+")
A_MONTH_MS = 30 * 86_400_000


def flashes(response) -> list[str]:
    return re.findall(r'class="flash \w+" role="\w+">([^<]*)<', response.get_data(as_text=True))


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def register(client, tenant: str = TENANT) -> str:
    body = {"url": HOOK, "events": ["job.completed", "job.failed"]}
    response = client.post(
        "/api/v1/webhooks", json=body, headers=bearer(tenant=tenant, user="olga", roles=OPERATOR)
    )
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()["id"]


def delivery(endpoint_id: str, tenant: str = TENANT) -> str:
    """A delivery job of the endpoint, for a failed job, due in a month (nothing sends it)."""
    event = {
        "id": unique("event"),
        "type": "job.failed",
        "data": {"jobId": unique("ended"), "name": "report.generate", "state": "failed"},
    }
    data = {"endpointId": endpoint_id, "event": event}
    opts = JobOptions(delay=A_MONTH_MS)
    owner = Owner(tenant, "olga")
    return add(webhooks.DELIVER, data, queue=webhooks.QUEUE, opts=opts, owner=owner).job_id


def stored_secret(endpoint_id: str) -> str:
    with transaction() as session:
        endpoint = session.get(WebhookEndpoint, endpoint_id)
        assert endpoint is not None
        return endpoint.secret


def test_registering_through_the_form_shows_the_secret_once(app, client):
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    form = {
        "csrf_token": csrf_token(operator),
        "url": HOOK,
        "events": ["job.completed", "job.failed"],
        "description": "billing sync",
    }
    # When an operator registers an endpoint through the form
    answer = operator.post("/ui/webhooks", data=form, headers=PAGE)
    # Then the page that answers shows its secret, with the note, and is not to be cached
    assert answer.status_code == 200 and "Location" not in answer.headers
    assert answer.headers["Cache-Control"] == "no-store"
    page = text(answer)
    [shown] = set(SECRET.findall(page))
    assert "Copy it now, it is not shown again" in page
    [endpoint_id] = set(re.findall(r"wh_[0-9a-f]{32}", page))
    assert shown == stored_secret(endpoint_id)
    # And the endpoint is the API's, as registered (by olga)
    stored = client.get(f"/api/v1/webhooks/{endpoint_id}", headers=API).get_json()
    assert (stored["url"], stored["events"], stored["description"], stored["createdBy"]) == (
        HOOK,
        ["job.completed", "job.failed"],
        "billing sync",
        "olga",
    )
    # And neither the list nor the endpoint's page shows the secret again
    listed = text(operator.get("/ui/webhooks", headers=PAGE))
    assert f'data-webhook-id="{endpoint_id}"' in listed and "billing sync" in listed
    one = text(operator.get(f"/ui/webhooks/{endpoint_id}", headers=PAGE))
    assert HOOK in one and "No deliveries yet" in one
    for later in (listed, one):
        assert shown not in later and not SECRET.search(later) and 'id="secret"' not in later


@pytest.mark.parametrize(
    "url,events,field",
    [
        ("http://10.0.0.1/x", ["job.failed"], None),  # the API's reason, word for word
        ("ftp://hooks.example.com/x", ["job.failed"], "url"),
        (HOOK, [], "events"),
        (HOOK, ["job.started"], "events"),
    ],
)
def test_a_refused_form_comes_back_with_the_apis_reason(app, client, url, events, field):
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    before = client.get("/api/v1/webhooks", headers=API).get_json()["webhooks"]
    form = {"csrf_token": csrf_token(operator), "url": url, "events": events}
    answer = operator.post("/ui/webhooks", data=form, headers=PAGE)
    api = client.post("/api/v1/webhooks", json={"url": url, "events": events}, headers=API)
    # Refused as the API refuses it, with its message, the form keeping what was typed
    assert answer.status_code == api.status_code == 400
    page = text(answer)
    [said] = re.findall(r'id="form-error">([^<]*)<', page)
    assert said.startswith(api.get_json()["message"]) and (field is None or f"({field}" in said)
    assert f'name="url" value="{url}"' in page and not SECRET.search(page)
    assert client.get("/api/v1/webhooks", headers=API).get_json()["webhooks"] == before


def test_a_delivery_is_listed_with_its_job_link_and_send_again_adds_a_delivery(app, client):
    endpoint_id = register(client)
    delivery_id = delivery(endpoint_id)
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    # The endpoint's page lists the delivery, linked to its job's page, with its state
    page = text(operator.get(f"/ui/webhooks/{endpoint_id}", headers=PAGE))
    row = re.search(rf'<tr data-delivery-id="{re.escape(delivery_id)}">(.*?)</tr>', page, re.S)
    assert row is not None, page
    assert f'href="/ui/jobs/{delivery_id}"' in row.group(1) and "delayed" in row.group(1)
    assert "job.failed" in row.group(1) and "0 / 0" in row.group(1)
    # When the operator sends it again
    url = f"/ui/webhooks/deliveries/{delivery_id}/resend"
    sent = operator.post(url, data={"csrf_token": csrf_token(operator)}, follow_redirects=True)
    # Then a new delivery job of the same event to the same endpoint exists, and is listed
    [said] = flashes(sent)
    again = said.removeprefix("Sent again: delivery job ").removesuffix(".")
    assert again.startswith(f"{delivery_id}:again:"), said
    first, copy = job_record(delivery_id), job_record(again)
    assert first is not None and copy is not None, again
    assert (copy.name, copy.tenant_id, copy.data) == (webhooks.DELIVER, TENANT, first.data)
    assert sent.request.path == f"/ui/webhooks/{endpoint_id}"
    assert f'data-delivery-id="{again}"' in text(sent)


def test_deliveries_are_paged_by_cursor_newest_first(app, client):
    endpoint_id = register(client)
    made = [delivery(endpoint_id) for _ in range(3)]
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    first = text(operator.get(f"/ui/webhooks/{endpoint_id}?limit=2", headers=PAGE))
    assert re.findall(r'data-delivery-id="([^"]+)"', first) == made[:0:-1]
    older = html.unescape(re.search(r'href="([^"]+)" rel="next"', first).group(1))
    second = text(operator.get(older, headers=PAGE))
    assert re.findall(r'data-delivery-id="([^"]+)"', second) == made[:1]


def test_removing_an_endpoint_from_its_page(app, client):
    endpoint_id = register(client)
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    page = text(operator.get(f"/ui/webhooks/{endpoint_id}", headers=PAGE))
    assert 'id="remove-form"' in page and "data-confirm=" in page
    url = f"/ui/webhooks/{endpoint_id}/remove"
    removed = operator.post(url, data={"csrf_token": csrf_token(operator)}, follow_redirects=True)
    assert flashes(removed) == [f"Webhook endpoint {endpoint_id} removed."]
    assert f'data-webhook-id="{endpoint_id}"' not in text(removed)
    assert client.get(f"/api/v1/webhooks/{endpoint_id}", headers=API).status_code == 404
    assert operator.get(f"/ui/webhooks/{endpoint_id}", headers=PAGE).status_code == 404


def test_another_tenants_operator_finds_nothing_and_a_user_is_not_allowed(app, client):
    endpoint_id = register(client)
    delivery_id = delivery(endpoint_id)
    report = client.post("/api/v1/reports", json={"reportId": unique(), "rows": 3}, headers=API)
    not_a_delivery = report.get_json()["jobId"]
    pages = [f"/ui/webhooks/{endpoint_id}"]
    forms = [
        f"/ui/webhooks/{endpoint_id}/remove",
        f"/ui/webhooks/deliveries/{delivery_id}/resend",
    ]
    # Another tenant's operator: 404 on the endpoint's page and on its actions
    intruder = signed_in(app, unique("other"), "olga", OPERATOR)
    token = csrf_token(intruder)
    for path in pages:
        assert intruder.get(path, headers=PAGE).status_code == 404, path
    for path in forms:
        answer = intruder.post(path, data={"csrf_token": token}, headers=PAGE)
        assert answer.status_code == 404, path
    assert endpoint_id not in text(intruder.get("/ui/webhooks", headers=PAGE))
    # A plain user of the tenant: the operator pages' 403
    alice = signed_in(app, TENANT, "alice")
    alice_token = csrf_token(alice)
    for path in ["/ui/webhooks", *pages]:
        page = alice.get(path, headers=PAGE)
        assert page.status_code == 403 and "for operators" in text(page), path
    for path in ["/ui/webhooks", *forms]:
        answer = alice.post(path, data={"csrf_token": alice_token, "url": HOOK}, headers=PAGE)
        assert answer.status_code == 403, path
    # The tenant's own operator: a job that is not a delivery is not one to send again
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    url = f"/ui/webhooks/deliveries/{not_a_delivery}/resend"
    answer = operator.post(url, data={"csrf_token": csrf_token(operator)}, headers=PAGE)
    assert answer.status_code == 404
    # And nothing was changed: the endpoint is there, no delivery was added
    assert client.get(f"/api/v1/webhooks/{endpoint_id}", headers=API).status_code == 200
    listed = client.get(f"/api/v1/webhooks/{endpoint_id}/deliveries", headers=API).get_json()
    assert [job["jobId"] for job in listed["jobs"]] == [delivery_id]
