"""``GET /api/v1/events`` (``web.tenant_events``): every job of the operator's tenant, as
Server-Sent Events, from the moment the stream opens; narrowed by queue, event and job
name; resumed exactly after ``Last-Event-ID``; another tenant's events never in it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tasks.jobs import Owner, add
from tests.support.client import bearer, unique, wait_state
from tests.support.events import names
from tests.support.stack import wait_for

pytestmark = pytest.mark.usefixtures("inline_worker")
URL = "/api/v1/events"


def operator(tenant: str) -> dict:
    return bearer(tenant=tenant, user="olga", roles=("operator",))


def blocks(response) -> Iterator[dict[str, str]]:
    """Each block of a ``text/event-stream`` body as it comes: its fields, ``data`` read."""
    pending = ""
    for chunk in response.response:
        pending += chunk.decode() if isinstance(chunk, bytes) else chunk
        while "\n\n" in pending:
            block, pending = pending.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            yield fields


def sent_until(stream: Iterator[dict[str, str]], done) -> list[dict]:
    """The events ``stream`` sends (each its data, with the block's ``id``) until ``done(seen)``."""
    seen: list[dict] = []
    for fields in stream:
        if "data" in fields:
            seen.append({**json.loads(fields["data"]), "blockId": fields["id"]})
            if done(seen):
                return seen
    raise AssertionError(f"the stream ended first: {seen}")


def ended(job_ids: set[str]):
    return lambda seen: {e["jobId"] for e in seen if e["event"] == "completed"} >= job_ids


def test_an_operator_follows_every_job_of_its_tenant_and_no_other_tenants(client):
    tenant, other = unique("t"), unique("other")
    before = add("test.echo", {"n": 0}, queue="default", owner=Owner(tenant, "alice")).job_id
    wait_for(lambda: "completed" in names("default", before), timeout=30)  # its event written
    # Given the tenant's stream, open
    response = client.get(f"{URL}?timeout=60", headers=operator(tenant), buffered=False)
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    stream = blocks(response)
    opening = next(stream)
    assert "id" in opening and "data" not in opening  # where to resume, sent at once
    try:
        # When two users of the tenant and another tenant add jobs
        mine = {
            add("test.echo", {"n": 1}, queue="default", owner=Owner(tenant, "alice")).job_id,
            add("test.echo", {"n": 2}, queue="default", owner=Owner(tenant, "bob")).job_id,
        }
        theirs = add("test.echo", {}, queue="default", owner=Owner(other, "eve")).job_id
        seen = sent_until(stream, ended(mine))
    finally:
        response.close()
    wait_state(theirs, "completed", timeout=30)
    # Then it sent both of its jobs' lives, nothing from before it opened, nothing of theirs
    assert {e["jobId"] for e in seen} == mine, seen
    for job in mine:
        lived = [e["event"] for e in seen if e["jobId"] == job]
        assert lived[0] == "waiting" and lived[-1] == "completed" and "active" in lived, lived
    assert {e["tenant"] for e in seen} == {tenant}
    # and the other tenant's operator, opened from where this one began, sees its own only
    resumed = client.get(
        f"{URL}?timeout=1", headers={**operator(other), "Last-Event-ID": opening["id"]}
    )
    theirs_seen = [e for e in blocks(resumed) if "data" in e]
    assert {json.loads(e["data"])["jobId"] for e in theirs_seen} == {theirs}


def test_filters_narrow_by_event_name_and_queue(client):
    tenant = unique("t")
    url = f"{URL}?timeout=60&event=completed,failed&name=test.echo&queue=default"
    response = client.get(url, headers=operator(tenant), buffered=False)
    stream = blocks(response)
    next(stream)
    try:
        echoed = add("test.echo", {}, queue="default", owner=Owner(tenant, "alice")).job_id
        other_name = add("test.sleep", {"s": 0}, queue="default", owner=Owner(tenant, "al")).job_id
        wait_state(other_name, "completed", timeout=30)
        seen = sent_until(stream, ended({echoed}))
    finally:
        response.close()
    assert [(e["jobId"], e["event"]) for e in seen] == [(echoed, "completed")]


def test_a_stream_resumes_exactly_after_the_last_event_it_sent(client):
    tenant = unique("t")
    response = client.get(f"{URL}?timeout=60", headers=operator(tenant), buffered=False)
    stream = blocks(response)
    next(stream)
    try:
        jobs = {
            add("test.echo", {"n": n}, queue="default", owner=Owner(tenant, "alice")).job_id
            for n in range(3)
        }
        seen = sent_until(stream, ended(jobs))
    finally:
        response.close()
    assert len(seen) >= 9  # waiting, active, completed of each
    # A client that got the first four events reconnects with the fourth's id
    again = client.get(
        f"{URL}?timeout=1", headers={**operator(tenant), "Last-Event-ID": seen[3]["blockId"]}
    )
    rest = [json.loads(e["data"]) for e in blocks(again) if "data" in e]
    assert [(e["jobId"], e["event"]) for e in rest] == [(e["jobId"], e["event"]) for e in seen[4:]]


@pytest.mark.parametrize(
    "query, headers, field",
    [
        ("queue=no-such-queue", {}, "queue"),
        ("event=exploded", {}, "event"),
        ("name=" + ",".join(f"n{i}" for i in range(51)), {}, "name"),
        ("timeout=0", {}, "timeout"),
        ("timeout=nan", {}, "timeout"),
        ("colour=red", {}, "colour"),
        ("", {"Last-Event-ID": "yesterday"}, "Last-Event-ID"),
        ("", {"Last-Event-ID": "default=1-2&reports=x"}, "Last-Event-ID"),
    ],
)
def test_a_bad_request_is_400_naming_what(client, query, headers, field):
    answer = client.get(f"{URL}?{query}", headers={**operator(unique("t")), **headers})
    assert answer.status_code == 400, answer.get_data(as_text=True)
    assert field in [d["field"] for d in answer.get_json()["details"]], answer.get_json()


def test_the_tenants_stream_is_for_operators(client):
    assert client.get(f"{URL}?timeout=0.5", headers=bearer(tenant=unique("t"))).status_code == 403
    assert client.get(f"{URL}?timeout=0.5").status_code == 401
