"""``GET /api/v1/jobs/<id>/events``: any job's events over the API, as the report jobs' stream
serves them (``web.events``): replayed then live, resumed after ``Last-Event-ID``, ended
by the job's end, for whoever may read the job and nobody else."""

from __future__ import annotations

import threading
import time

import pytest

from tasks.jobs import JobOptions, Owner, add
from tests.support.client import bearer, unique, wait_state

pytestmark = pytest.mark.usefixtures("inline_worker")
DAY_MS = 86_400_000


def sse_events(body: str) -> list[tuple[str, str]]:
    """``(id, event)`` of each event of a ``text/event-stream`` body."""
    found = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            found.append((fields["id"], fields["event"]))
    return found


def test_a_jobs_events_are_replayed_and_end_with_its_end_and_resume_after_an_id(client):
    tenant = unique("t")
    owner, headers = Owner(tenant, "alice"), bearer(tenant=tenant)
    job = add("test.echo", {"n": 1}, queue="default", owner=owner).job_id
    wait_state(job, "completed", timeout=30)
    # The finished job's stream replays its events and ends with completed, at once
    began = time.monotonic()
    response = client.get(f"/api/v1/jobs/{job}/events?timeout=60", headers=headers)
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    seen = sse_events(response.get_data(as_text=True))
    assert time.monotonic() - began < 30
    assert [name for _, name in seen][-1] == "completed", seen
    assert "active" in [name for _, name in seen]
    # and after the first event's id it sends the rest only
    resumed = client.get(
        f"/api/v1/jobs/{job}/events", headers={**headers, "Last-Event-ID": seen[0][0]}
    )
    assert sse_events(resumed.get_data(as_text=True)) == seen[1:]


def test_a_live_stream_follows_a_delayed_job_until_it_is_cancelled(client):
    tenant = unique("t")
    headers = bearer(tenant=tenant)
    opts = JobOptions(delay=DAY_MS)
    job = add("test.echo", {}, queue="default", opts=opts, owner=Owner(tenant, "alice")).job_id
    bodies: list[str] = []

    def follow() -> None:
        stream = client.get(f"/api/v1/jobs/{job}/events?timeout=60", headers=headers)
        bodies.append(stream.get_data(as_text=True))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    time.sleep(0.5)  # the stream is open and following
    assert client.delete(f"/api/v1/jobs/{job}", headers=headers).status_code == 200
    follower.join(timeout=20)
    assert not follower.is_alive()
    assert [name for _, name in sse_events(bodies[0])][-1] == "cancelled", bodies


def test_only_who_may_read_the_job_follows_it_and_bad_requests_are_400(client):
    tenant = unique("t")
    opts = JobOptions(delay=DAY_MS)
    job = add("test.echo", {}, queue="default", opts=opts, owner=Owner(tenant, "alice")).job_id
    url = f"/api/v1/jobs/{job}/events?timeout=0.5"
    assert client.get(url, headers=bearer(tenant=tenant, user="bob")).status_code == 404
    other = bearer(tenant=unique("other"), roles=("operator",))
    assert client.get(url, headers=other).status_code == 404
    operator = bearer(tenant=tenant, user="olga", roles=("operator",))
    followed = client.get(url, headers=operator)
    assert followed.status_code == 200
    assert [name for _, name in sse_events(followed.get_data(as_text=True))] == ["delayed"]
    alice = bearer(tenant=tenant)
    bad_id = client.get(url, headers={**alice, "Last-Event-ID": "yesterday"})
    assert bad_id.status_code == 400 and bad_id.get_json()["details"][0]["field"] == "Last-Event-ID"
    bad_timeout = client.get(f"/api/v1/jobs/{job}/events?timeout=0", headers=alice)
    assert bad_timeout.status_code == 400
