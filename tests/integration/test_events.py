"""Job events are visible from any process: ``keel events`` and the SSE endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasks.jobs import Owner, add
from tasks.reports import service
from tasks.reports.operation_key import operation_key
from tests.support.client import bearer, unique, wait_state
from tests.support.events import EventFollower

pytestmark = pytest.mark.usefixtures("inline_worker")

# A report whose first run fails: BullMQ's whole retry sequence, then success.
RETRIED_SEQUENCE = [
    "waiting",
    "active",
    "retrying",
    "delayed",
    "waiting",
    "active",
    "progress",
    "progress",
    "progress",
    "progress",
    "completed",
]


@pytest.fixture(scope="module")
def follower(stack):
    """``keel events --queue reports --follow``, started before any job of this module."""
    process = EventFollower("--queue", "reports").start()
    yield process
    process.stop()


def submit(client, report_id: str, **extra) -> dict:
    response = client.post(
        "/api/v1/reports", json={"reportId": report_id, "rows": 7, **extra}, headers=bearer()
    )
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def read_sse(response) -> list[dict]:
    """Parse a ``text/event-stream`` body into its events (comments skipped)."""
    found = []
    for block in response.get_data(as_text=True).split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            found.append(
                {"id": fields["id"], "event": fields["event"], "data": json.loads(fields["data"])}
            )
    return found


def events_url(job_id: str, query: str = "") -> str:
    return f"/api/v1/reports/jobs/{job_id}/events{query}"


def test_keel_events_shows_a_retried_job_from_start_to_finish(client, follower):
    # Given `keel events --follow` running in its own process
    # When a report fails once and then succeeds
    job_id = submit(client, unique(), failUntilAttempt=1)["jobId"]
    # Then that process printed the whole sequence, in order, with its details
    seen = follower.wait_for_event(job_id, "completed")
    assert [e["event"] for e in seen] == RETRIED_SEQUENCE
    retrying = seen[2]
    assert retrying["attemptsMade"] == 1 and "attempt 1" in retrying["failedReason"]
    assert 500 <= seen[3]["delay"] <= 1000
    assert [e["data"]["percent"] for e in seen if e["event"] == "progress"] == [20, 70, 95, 100]
    assert seen[-1]["returnvalue"]["generatedRows"] == 7
    assert all(e["queue"] == "reports" and e["name"] == "report.generate" for e in seen)


def test_keel_events_shows_a_deduplicated_add_with_both_ids(client, follower):
    # Given a report job that is still live
    report_id = unique()
    kept = submit(client, report_id, failUntilAttempt=1)
    # When the same report is submitted again
    again = submit(client, report_id)
    # Then the add was absorbed, and the event names the kept and the discarded job
    assert again["deduplicated"] is True and again["jobId"] == kept["jobId"]
    event = next(
        e
        for e in follower.wait_for_event(kept["jobId"], "deduplicated")
        if e["event"] == "deduplicated"
    )
    assert event["deduplicationId"] == operation_key("acme", "alice", report_id, 7)
    assert event["deduplicatedJobId"] not in ("", kept["jobId"])
    follower.wait_for_event(kept["jobId"], "completed")


def test_the_event_stream_replays_a_finished_job_and_ends(client):
    # Given a report job that has finished
    job_id = submit(client, unique(), failUntilAttempt=1)["jobId"]
    wait_state(job_id, "completed")
    # When its owner opens the job's event stream
    started = time.monotonic()
    response = client.get(events_url(job_id), headers=bearer())
    # Then every past event is replayed as SSE and the stream ends at once
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-cache"
    events = read_sse(response)
    assert time.monotonic() - started < 5
    assert [e["event"] for e in events] == RETRIED_SEQUENCE
    assert all(e["data"]["jobId"] == job_id and e["data"]["id"] == e["id"] for e in events)


def test_the_event_stream_follows_a_running_job_until_it_completes(client):
    # Given a report job just submitted (its first run will fail)
    job_id = submit(client, unique(), failUntilAttempt=1)["jobId"]
    # When its owner opens the stream right away
    response = client.get(events_url(job_id, "?timeout=60"), headers=bearer())
    events = read_sse(response)
    # Then the stream carried the live events and closed after `completed`
    assert [e["event"] for e in events] == RETRIED_SEQUENCE
    assert wait_state(job_id, "completed", timeout=1)["state"] == "completed"


def test_the_event_stream_resumes_after_last_event_id(client):
    # Given the replayed events of a finished job
    job_id = submit(client, unique())["jobId"]
    wait_state(job_id, "completed")
    events = read_sse(client.get(events_url(job_id), headers=bearer()))
    # When the client reconnects after its first `active` event
    active = next(e for e in events if e["event"] == "active")
    resumed = read_sse(
        client.get(events_url(job_id), headers={**bearer(), "Last-Event-ID": active["id"]})
    )
    # Then only the later events are sent
    assert resumed == events[events.index(active) + 1 :]


def test_the_event_stream_ends_after_its_timeout(client):
    # Given a report job scheduled a minute from now
    now = datetime.now(UTC)
    submitted = service.submit(
        Owner("acme", "alice"), unique(), 3, run_at=now + timedelta(seconds=60), now=now
    )
    # When its owner follows it with a 1 s timeout
    started = time.monotonic()
    events = read_sse(client.get(events_url(submitted.job_id, "?timeout=1"), headers=bearer()))
    # Then the `delayed` event is replayed and the stream ends after about 1 s
    assert [e["event"] for e in events] == ["delayed"]
    assert 0.9 <= time.monotonic() - started < 4


@pytest.mark.parametrize("timeout", ["0", "-1", "301", "soon", "nan"])
def test_an_invalid_timeout_is_400(client, timeout):
    job_id = submit(client, unique())["jobId"]
    response = client.get(events_url(job_id, f"?timeout={timeout}"), headers=bearer())
    assert response.status_code == 400
    assert response.get_json()["error"] == "validation_failed"


@pytest.mark.parametrize(
    ("tenant", "user"), [("other", "alice"), ("acme", "bob")], ids=["tenant", "user"]
)
def test_another_owner_gets_404_like_a_missing_job(client, tenant, user):
    job_id = submit(client, unique())["jobId"]
    theirs = client.get(events_url(job_id), headers=bearer(tenant, user))
    missing = client.get(events_url("no-such-job"), headers=bearer())
    assert theirs.status_code == missing.status_code == 404
    assert theirs.get_json()["error"] == missing.get_json()["error"] == "not_found"


def test_the_event_stream_needs_a_token(client):
    assert client.get(events_url("anything")).status_code == 401


def test_the_event_stream_is_described_in_openapi(client):
    path = client.get("/api/v1/openapi.json").get_json()["paths"][
        "/api/v1/reports/jobs/{job_id}/events"
    ]
    assert "text/event-stream" in path["get"]["responses"]["200"]["content"]


def test_a_long_runs_active_event_is_in_the_stream_while_it_runs():
    # A run's `active` is held back to go out with its end when the run is short; a long
    # run's goes out on its own meanwhile
    from tasks.jobs.observe import events
    from tests.support.client import record
    from tests.support.jobs import celery_part
    from tests.support.stack import wait_for

    job_id = celery_part.delay(0, unique("long"), ms=3000).id
    queue = wait_state(job_id, "active")["queue"]

    def active_seen() -> bool:
        return any(e["event"] == "active" and e["jobId"] == job_id for e in events.read([queue]))

    wait_for(active_seen, timeout=2, interval=0.05)
    assert record(job_id)["state"] == "active"  # still running: its end has not been sent
    completed = wait_state(job_id, "completed")
    kinds = [e["event"] for e in events.read([queue]) if e["jobId"] == job_id]
    assert kinds == ["waiting", "active", "completed"], (kinds, completed)


def test_keel_events_narrowed_to_a_tenant_prints_its_jobs_only():
    # Given a job of each of two tenants, ended
    tenant, other = unique("t"), unique("other")
    mine = add("test.echo", {}, queue="default", owner=Owner(tenant, "alice")).job_id
    theirs = add("test.echo", {}, queue="default", owner=Owner(other, "bob")).job_id
    wait_state(mine, "completed", timeout=30)
    wait_state(theirs, "completed", timeout=30)
    # When `keel events --tenant` reads the queue's stream from its start
    keel = str(Path(sys.executable).with_name("keel"))
    printed = subprocess.run(
        [keel, "events", "--queue", "default", "--tenant", tenant],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = [json.loads(line) for line in printed.splitlines()]
    # Then it printed the tenant's job's life, and nothing of anyone else's
    assert {e["jobId"] for e in lines} == {mine}
    assert [e["event"] for e in lines][-1] == "completed" and {e["tenant"] for e in lines} == {
        tenant
    }
