"""Delayed jobs and job schedulers fired by real Celery beat processes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from tasks.jobs import JobOptions, add
from tasks.jobs.model.models import JobRecord
from tasks.jobs.schedule.schedulers import Scope, fire_prefix, get
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tasks.reports.schedules import DAILY_CLEANUP_ID
from tests.support.chaos import priority_lists
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import BeatProcess, WorkerProcess, wait_for

pytestmark = pytest.mark.usefixtures("worker")
OPERATOR = bearer(roles=("operator",))


@pytest.fixture(scope="module")
def beats(stack):
    """Three beat processes at once, as several replicas would run them."""
    processes = [BeatProcess(stack.home, f"b{n}") for n in range(3)]
    for process in processes:
        process.start()
    yield processes
    for process in processes:
        process.stop()


def fired_jobs(tenant: str, scheduler_id: str) -> list[tuple[str, datetime]]:
    prefix = fire_prefix(tenant, scheduler_id)
    with transaction() as session:
        ids = session.scalars(select(JobRecord.id).where(JobRecord.id.startswith(prefix))).all()
    fires = [(i, datetime.fromtimestamp(int(i.rsplit(":", 1)[1]) / 1000, UTC)) for i in ids]
    return sorted(fires, key=lambda pair: pair[1])


def put(client, scheduler_id: str, body: dict, headers=OPERATOR):
    return client.put(f"/api/v1/schedulers/{scheduler_id}", json=body, headers=headers)


# --- delayed jobs ---------------------------------------------------------------------------


def test_a_report_scheduled_three_seconds_ahead_is_delayed_then_completed(client):
    run_at = datetime.now(UTC) + timedelta(seconds=3)
    response = client.post(
        "/api/v1/reports/scheduled",
        headers=bearer(),
        json={"reportId": unique(), "rows": 5, "runAt": run_at.isoformat()},
    )
    assert response.status_code == 202, response.get_json()
    body = response.get_json()
    assert body["runAt"] == run_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert client.get(body["statusUrl"], headers=bearer()).get_json()["state"] == "delayed"
    job = wait_state(body["jobId"], "completed", timeout=20)
    started = datetime.fromisoformat(job["runs"][0]["startedAt"].replace("Z", "+00:00"))
    assert started >= run_at - timedelta(milliseconds=50)


@pytest.mark.parametrize(
    "run_at",
    [
        (datetime.now(UTC) - timedelta(seconds=5)).isoformat(),
        "tomorrow at noon",
        "2030-01-01T00:00:00",  # no time zone: ambiguous
        12345,
    ],
    # Named, not by value: each pytest process (xdist) collects the same tests only if the
    # past moment's id is not the moment itself.
    ids=["past", "words", "no-zone", "number"],
)
def test_run_at_must_be_a_future_iso_time_with_zone(client, run_at):
    response = client.post(
        "/api/v1/reports/scheduled",
        headers=bearer(),
        json={"reportId": "x", "rows": 1, "runAt": run_at},
    )
    assert response.status_code == 400
    assert response.get_json()["error"] == "validation_failed"


def test_long_delays_outlive_the_visibility_timeout_and_run_once(stack):
    # Given a worker whose broker visibility timeout is 10 s
    queue = unique("vt")
    worker = WorkerProcess(
        stack.home,
        unique("vt"),
        concurrency=3,
        queues=queue,
        extra_env={"KEEL_VISIBILITY_TIMEOUT_S": "10"},
    )
    worker.start()
    try:
        # When 50 jobs are delayed 30 s
        jobs = [
            add("test.echo", {"i": i}, queue=queue, opts=JobOptions(delay=30_000)).job_id
            for i in range(50)
        ]
        time.sleep(12)
        # Then nothing waits in the broker or in worker memory meanwhile
        assert sum(redis_client().llen(name) for name in priority_lists(queue)) == 0
        assert all(wait_state(j, "delayed", timeout=1) for j in jobs[:3])
        # And each runs exactly once when due
        done = [wait_state(j, "completed", timeout=40) for j in jobs]
    finally:
        worker.stop()
    assert all(job["attemptsStarted"] == 1 and len(job["runs"]) == 1 for job in done)


# --- job schedulers -------------------------------------------------------------------------


def test_three_beats_make_one_job_per_fire(client, beats):
    scheduler_id = unique("every")
    response = put(client, scheduler_id, {"every": 1000, "template": {"name": "test.echo"}})
    assert response.status_code == 200, response.get_json()
    first = datetime.fromisoformat(response.get_json()["next"].replace("Z", "+00:00"))
    time.sleep(10.2)
    assert client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR).status_code == 204
    fires = [at for _, at in fired_jobs("acme", scheduler_id) if at < first + timedelta(seconds=10)]
    assert 9 <= len(fires) <= 11
    assert len(set(fires)) == len(fires)
    log = "".join(b.log_path.read_text() for b in beats)
    assert sum(1 for b in beats if "scheduler fired job" in b.log_path.read_text()) >= 1, log[-500:]


def test_seconds_pattern_in_a_time_zone_fires_on_even_seconds(client, beats):
    scheduler_id = unique("even")
    put(
        client,
        scheduler_id,
        {"pattern": "*/2 * * * * *", "tz": "Asia/Seoul", "template": {"name": "test.echo"}},
    )
    time.sleep(5)
    client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)
    fires = fired_jobs("acme", scheduler_id)
    assert len(fires) >= 2
    assert all(at.second % 2 == 0 and at.microsecond == 0 for _, at in fires)
    created = wait_state(fires[0][0], "completed")["createdAt"]
    lag = datetime.fromisoformat(created.replace("Z", "+00:00")) - fires[0][1]
    assert timedelta(0) <= lag < timedelta(seconds=1.5)


def test_limit_three_makes_three_jobs(client, beats):
    scheduler_id = unique("limited")
    put(client, scheduler_id, {"every": 300, "limit": 3, "template": {"name": "test.echo"}})
    wait_for(lambda: len(fired_jobs("acme", scheduler_id)) >= 3, timeout=10)
    time.sleep(1.5)
    assert len(fired_jobs("acme", scheduler_id)) == 3
    assert (
        client.get(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR).get_json()["next"]
        is None
    )


def test_upsert_updates_in_place_and_remove_stops_jobs(client, beats):
    scheduler_id = unique("upsert")
    put(
        client,
        scheduler_id,
        {
            "pattern": "0 0 3 * * *",
            "tz": "Asia/Seoul",
            "template": {"name": "test.echo", "data": {"v": 1}},
        },
    )
    updated = put(
        client, scheduler_id, {"every": 500, "template": {"name": "test.echo", "data": {"v": 2}}}
    )
    assert updated.status_code == 200
    mine = client.get("/api/v1/schedulers", headers=OPERATOR).get_json()["schedulers"]
    [entry] = [s for s in mine if s["id"] == scheduler_id]
    assert entry["every"] == 500 and "pattern" not in entry
    assert entry["template"]["data"] == {"v": 2}
    wait_for(lambda: fired_jobs("acme", scheduler_id), timeout=5)
    client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)
    time.sleep(0.5)
    count = len(fired_jobs("acme", scheduler_id))
    time.sleep(2)
    assert len(fired_jobs("acme", scheduler_id)) == count
    assert client.get(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR).status_code == 404


def test_a_five_field_pattern_is_accepted_and_due_on_the_minute(client):
    response = put(
        client, unique("five"), {"pattern": "*/5 * * * *", "template": {"name": "test.echo"}}
    )
    assert response.status_code == 200
    next_fire = datetime.fromisoformat(response.get_json()["next"].replace("Z", "+00:00"))
    assert next_fire.minute % 5 == 0 and next_fire.second == 0


def test_schedulers_are_operator_only_and_tenant_scoped(client):
    scheduler_id = unique("scoped")
    body = {"every": 60_000, "template": {"name": "test.echo"}}
    assert put(client, scheduler_id, body, headers=bearer()).status_code == 403
    assert put(client, scheduler_id, body).status_code == 200
    other = bearer(tenant="globex", roles=("operator",))
    assert client.get(f"/api/v1/schedulers/{scheduler_id}", headers=other).status_code == 404
    assert client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=other).status_code == 404
    assert (
        put(
            client, scheduler_id, {**body, "template": {"name": "x", "opts": {"jobId": "j"}}}
        ).status_code
        == 400
    )
    client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)


def test_beat_start_upserts_the_daily_cleanup(beats):
    record = get(Scope(), DAILY_CLEANUP_ID)
    assert record.spec["pattern"] == "0 0 3 * * *" and record.spec["tz"] == "Asia/Seoul"
    assert record.spec["template"]["name"] == "reports.cleanup"
    assert record.spec["template"]["data"] == {"keepDays": 30}
    assert record.next_run_at.astimezone(UTC).hour == 18  # 03:00 in Seoul


def test_cleanup_removes_exactly_the_artifacts_older_than_keep_days():
    old, fresh = unique("old"), unique("fresh")
    with transaction() as session:
        for key, age_days in ((old, 31), (fresh, 29)):
            session.execute(
                text(
                    "INSERT INTO report_artifacts (operation_key, tenant_id, report_id, "
                    "object_key, generated_rows, job_id, created_at) "
                    "VALUES (:k, 't', 'r', 'o', 1, 'j', "
                    "now() - make_interval(days => :d))"
                ),
                {"k": key, "d": age_days},
            )
        before = session.execute(
            text(
                "SELECT count(*) FROM report_artifacts "
                "WHERE created_at < now() - interval '30 days'"
            )
        ).scalar()
    job = add("reports.cleanup", {"keepDays": 30}, queue="reports")
    result = wait_state(job.job_id, "completed")["result"]
    assert result == {"removed": before}
    with transaction() as session:
        keys = set(session.scalars(text("SELECT operation_key FROM report_artifacts")))
    assert fresh in keys and old not in keys
