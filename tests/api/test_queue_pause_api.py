"""``/api/v1/queues/<queue>/pause`` and ``/resume``: who may, on which queue, and what the
answers say (no worker here: what pausing does to jobs is tests/integration/test_pause.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from flask import jsonify

from tasks.jobs.intake import pauses
from tests.support import jobs as _test_jobs  # noqa: F401  (the test.pausable queue)
from tests.support.client import bearer, metrics_headers, unique
from web import create_app

QUEUE = "pausable"
# Every timestamp of the API: ISO 8601, UTC, to the millisecond (a job's ``createdAt``)
ISO_UTC_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture
def operator():
    return bearer(unique("t"), "ops", ("operator",))


def test_only_operators_pause(client):
    response = client.post(f"/api/v1/queues/{QUEUE}/pause", headers=bearer(unique("t")))
    assert response.status_code == 403
    assert response.get_json()["error"] == "forbidden"


def test_a_queue_no_job_type_runs_on_is_not_found(client, operator):
    for action in ("pause", "resume"):
        response = client.post(f"/api/v1/queues/nosuch-{unique()}/{action}", headers=operator)
        assert response.status_code == 404, response.get_json()
        assert response.get_json()["error"] == "queue_not_found"


def test_pause_and_resume_are_idempotent(client, operator):
    first = client.post(f"/api/v1/queues/{QUEUE}/pause", headers=operator).get_json()
    again = client.post(f"/api/v1/queues/{QUEUE}/pause", headers=operator).get_json()
    assert (first["changed"], again["changed"]) == (True, False)
    assert first["paused"] and again["paused"]
    resumed = client.post(f"/api/v1/queues/{QUEUE}/resume", headers=operator).get_json()
    twice = client.post(f"/api/v1/queues/{QUEUE}/resume", headers=operator).get_json()
    assert (resumed["changed"], twice["changed"]) == (True, False)
    assert not resumed["paused"] and not twice["paused"]


def test_paused_at_is_iso_8601_in_utc_as_every_other_timestamp(client, operator):
    # Given a tenant's pause of the queue
    before = datetime.now(UTC)
    assert client.post(f"/api/v1/queues/{QUEUE}/pause", headers=operator).get_json()["changed"]
    try:
        # When its operator lists the queues
        (shown,) = client.get("/api/v1/queues", headers=operator).get_json()["paused"]
        # Then the pause's time is written as a job's createdAt is, and is when it paused
        assert (shown["queue"], shown["scope"], shown["pausedBy"]) == (QUEUE, "tenant", "ops")
        assert ISO_UTC_MS.fullmatch(shown["pausedAt"]), shown
        at = datetime.fromisoformat(shown["pausedAt"].replace("Z", "+00:00"))
        assert before - timedelta(seconds=2) <= at <= datetime.now(UTC) + timedelta(seconds=2)
    finally:
        assert client.post(f"/api/v1/queues/{QUEUE}/resume", headers=operator).get_json()["changed"]


def test_a_raw_datetime_a_view_returns_is_iso_8601_in_utc_too(stack):
    # Given a view that hands jsonify a time zone aware datetime as it is (not through iso()),
    # on an app of its own (the session's has served requests: no view may be added)
    app = create_app({"TESTING": True})
    moment = datetime(2026, 12, 7, 2, 16, 40, 123456, tzinfo=timezone(timedelta(hours=1)))
    app.add_url_rule("/raw-moment", "raw_moment", lambda: jsonify(at=moment, day=moment.date()))
    # When it answers
    shown = app.test_client().get("/raw-moment").get_json()
    # Then the datetime is written as a job's createdAt is (UTC, milliseconds), not as an
    # HTTP date, and a date as ISO 8601 too
    assert ISO_UTC_MS.fullmatch(shown["at"]), shown
    assert shown["at"] == "2026-12-07T01:16:40.123Z"
    assert shown["day"] == "2026-12-07"


def test_a_pause_of_the_whole_queue_shows_to_every_tenant_and_only_the_system_lifts_it(
    client, operator
):
    assert pauses.pause(QUEUE, by="cli:root")
    try:
        shown = client.get("/api/v1/queues", headers=operator).get_json()["paused"]
        assert [(p["queue"], p["scope"]) for p in shown] == [(QUEUE, "all")]
        assert shown[0]["pausedBy"] is None  # the system's account is not the tenant's to see
        # a tenant's resume lifts its own pause only: the queue stays paused for it
        answer = client.post(f"/api/v1/queues/{QUEUE}/resume", headers=operator).get_json()
        assert answer == {"queue": QUEUE, "paused": True, "changed": False, "released": 0}
        scraped = client.get("/metrics", headers=metrics_headers()).get_data(as_text=True)
        assert f'keel_queue_paused{{queue="{QUEUE}"}} 1.0' in scraped
    finally:
        assert pauses.resume(QUEUE, by="cli:root").lifted
    scraped = client.get("/metrics", headers=metrics_headers()).get_data(as_text=True)
    assert f'keel_queue_paused{{queue="{QUEUE}"}} 0.0' in scraped


def test_a_pause_of_a_queue_no_job_type_runs_on_any_more_can_be_lifted(client, operator):
    # Given a tenant's pause of a queue whose job types were since removed
    tenant = unique("t")
    gone = f"gone-{unique()}"
    assert pauses.pause(gone, tenant, by="ops")
    headers = bearer(tenant, "ops", ("operator",))
    # When its operator resumes it: lifted, though no job type runs on it
    response = client.post(f"/api/v1/queues/{gone}/resume", headers=headers)
    assert response.status_code == 200, response.get_json()
    assert response.get_json() == {"queue": gone, "paused": False, "changed": True, "released": 0}
    # and once lifted, the name is unknown again
    again = client.post(f"/api/v1/queues/{gone}/resume", headers=headers)
    assert again.status_code == 404 and again.get_json()["error"] == "queue_not_found"
