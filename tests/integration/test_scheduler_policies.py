"""Scheduler policies fired by two real beat processes and run by a real worker: overlap
(skip, buffer, cancel), catch-up after beat was stopped, paused, jitter and run now."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from sqlalchemy import select

from tasks.jobs.model.models import JobRecord
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule import schedulers
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope, fire_prefix
from tasks.platform.db import transaction
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import BeatProcess, wait_for

pytestmark = pytest.mark.usefixtures("worker")
OPERATOR = bearer(roles=("operator",))
LIVE = ("waiting", "delayed", "active", "waiting-children")


@pytest.fixture(scope="module")
def beats(stack):
    """Two beats at once, as two replicas would run them."""
    processes = [BeatProcess(stack.home, unique("policy")) for _ in range(2)]
    for process in processes:
        process.start()
    yield processes
    for process in processes:
        process.stop()


def fired(tenant: str, scheduler_id: str) -> list[JobRecord]:
    """The scheduler's jobs, by slot (the fire time their ids derive from)."""
    with transaction() as session:
        jobs = session.scalars(
            select(JobRecord).where(JobRecord.id.startswith(fire_prefix(tenant, scheduler_id)))
        ).all()
    return sorted(jobs, key=slot)


def slot(job: JobRecord) -> datetime:
    return datetime.fromtimestamp(int(job.id.rsplit(":", 1)[1]) / 1000, UTC)


def system_scheduler(overlap: str, every: int, sleep_ms: int) -> str:
    """A system scheduler of ``test.sleep`` jobs (a job type only the system may schedule)."""
    scheduler_id = unique(overlap)
    template = JobTemplate(name="test.sleep", data={"ms": sleep_ms})
    spec = SchedulerSpec(every=every, overlap=overlap, template=template)
    schedulers.upsert(Scope(actor="test"), scheduler_id, spec)
    return scheduler_id


def run_for(scheduler_id: str, seconds: float) -> list[JobRecord]:
    """Let the scheduler fire for ``seconds``, remove it, and wait for its jobs to end."""
    time.sleep(seconds)
    schedulers.remove(Scope(), scheduler_id)
    jobs = fired("", scheduler_id)
    for job in jobs:
        wait_state(job.id, "completed", "failed", "cancelled", timeout=30)
    return fired("", scheduler_id)


def put(client, scheduler_id: str, body: dict):
    return client.put(f"/api/v1/schedulers/{scheduler_id}", json=body, headers=OPERATOR)


def post(client, scheduler_id: str, action: str):
    return client.post(f"/api/v1/schedulers/{scheduler_id}/{action}", headers=OPERATOR)


# --- overlap --------------------------------------------------------------------------------


def test_skip_never_runs_two_jobs_of_the_scheduler_at_once(beats):
    # Given a scheduler every 1 s of a 2.5 s job, with three worker processes free
    scheduler_id = system_scheduler("skip", every=1000, sleep_ms=2500)
    # When it fires for 7 s
    jobs = run_for(scheduler_id, 7)
    # Then each job started after the one before it ended: the slots meanwhile were skipped
    assert 2 <= len(jobs) <= 4, [j.id for j in jobs]
    assert all(j.state == "completed" for j in jobs)
    for before, after in pairwise(jobs):
        assert after.processed_on >= before.finished_on, (before.id, after.id)


def test_buffer_holds_one_slot_until_the_last_job_ends(beats):
    # Given a scheduler every 1 s of a 2.5 s job, buffering
    scheduler_id = system_scheduler("buffer", every=1000, sleep_ms=2500)
    # When it fires for 7 s, watched every 0.1 s
    deadline = time.monotonic() + 7
    most_waiting = most_running = 0
    while time.monotonic() < deadline:
        states = [j.state for j in fired("", scheduler_id)]
        most_waiting = max(most_waiting, sum(s in ("waiting", "delayed") for s in states))
        most_running = max(most_running, states.count("active"))
        time.sleep(0.1)
    jobs = run_for(scheduler_id, 0)
    # Then never more than one ran, and none waited: the held slot had no job yet
    assert most_running == 1 and most_waiting <= 1
    for before, after in pairwise(jobs):
        assert after.processed_on >= before.finished_on, (before.id, after.id)
    # And a held slot fired once the job before it ended, late for its slot (a skip would not)
    late = [j for j in jobs[1:] if j.created_at - slot(j) > timedelta(seconds=0.7)]
    assert late, [(j.id, j.created_at) for j in jobs]
    assert 3 <= len(jobs) <= 4


def test_cancel_cancels_the_last_job_when_the_next_slot_fires(beats):
    # Given a scheduler every 1 s of a 3 s job that cancels the previous one
    scheduler_id = system_scheduler("cancel", every=1000, sleep_ms=3000)
    # When it fires for 4 s
    jobs = run_for(scheduler_id, 4)
    # Then every job but the last was cancelled (its run aborted), and the last completed
    assert len(jobs) >= 3
    assert [j.state for j in jobs[:-1]] == ["cancelled"] * (len(jobs) - 1)
    assert jobs[-1].state == "completed"


# --- paused, run now, the API -------------------------------------------------------------


def test_a_paused_scheduler_does_not_fire_and_resumes_at_its_next_slot(client, beats):
    scheduler_id = unique("paused")
    body = {"every": 500, "paused": True, "template": {"name": "test.echo"}}
    created = put(client, scheduler_id, body)
    assert created.status_code == 200, created.get_json()
    assert created.get_json()["paused"] is True and created.get_json()["next"] is None
    time.sleep(2)
    assert fired("acme", scheduler_id) == []
    # An upsert that does not say keeps it paused
    assert put(client, scheduler_id, {**body, "paused": None}).get_json()["paused"] is True
    resumed = post(client, scheduler_id, "resume")
    assert resumed.status_code == 200 and resumed.get_json()["paused"] is False
    wait_for(lambda: len(fired("acme", scheduler_id)) >= 2, timeout=5)
    paused = post(client, scheduler_id, "pause")
    assert paused.get_json()["paused"] is True and paused.get_json()["next"] is None
    time.sleep(0.5)  # a fire under way when it was paused has committed
    count = len(fired("acme", scheduler_id))
    time.sleep(2)
    assert len(fired("acme", scheduler_id)) == count
    client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)


def test_trigger_runs_now_paused_or_not_and_skip_applies(client, beats):
    # Given a paused scheduler whose jobs stay delayed (live) for a minute, skipping overlaps
    scheduler_id = unique("now")
    body = {
        "pattern": "0 0 3 * * *",
        "overlap": "skip",
        "paused": True,
        "template": {"name": "test.echo", "data": {"v": 1}, "opts": {"delay": 60_000}},
    }
    assert put(client, scheduler_id, body).status_code == 200
    # When it is run now
    first = post(client, scheduler_id, "trigger")
    assert first.status_code == 200, first.get_json()
    answer = first.get_json()
    assert answer["outcome"] == "added"
    assert answer["jobId"].startswith(fire_prefix("acme", scheduler_id))
    assert client.get(answer["statusUrl"], headers=OPERATOR).get_json()["state"] == "delayed"
    # Then a second run-now is skipped while that job is live
    assert post(client, scheduler_id, "trigger").get_json() == {
        "outcome": "skipped",
        "jobId": None,
        "statusUrl": None,
    }
    # And it neither counted as a fire nor unpaused the scheduler
    described = client.get(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR).get_json()
    assert described["iterationCount"] == 0 and described["paused"] is True
    # With the delayed job gone, run-now adds a job that runs
    client.delete(answer["statusUrl"], headers=OPERATOR)
    put(client, scheduler_id, {**body, "overlap": "allow", "template": {"name": "test.echo"}})
    again = post(client, scheduler_id, "trigger").get_json()
    assert again["outcome"] == "added" and again["jobId"] != answer["jobId"]
    wait_state(again["jobId"], "completed", timeout=10)
    client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)


def test_jitter_delays_each_job_within_its_bound(client, beats):
    scheduler_id = unique("jitter")
    body = {"every": 300, "jitter": 2000, "template": {"name": "test.echo"}}
    assert put(client, scheduler_id, body).get_json()["jitter"] == 2000
    wait_for(lambda: len(fired("acme", scheduler_id)) >= 6, timeout=10)
    client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)
    delays = []
    for job in fired("acme", scheduler_id)[:6]:
        done = wait_state(job.id, "completed", timeout=10)
        started = datetime.fromisoformat(done["runs"][0]["startedAt"].replace("Z", "+00:00"))
        delays.append((started - slot(job)).total_seconds())
    assert all(0 <= d < 3.5 for d in delays), delays
    assert max(delays) - min(delays) > 0.1, delays  # spread, not one fixed delay


@pytest.mark.parametrize(
    "field, value",
    [
        ("overlap", "queue"),
        ("catchUp", "never"),
        ("catchUpWindow", 5),
        ("jitter", -1),
        ("jitter", "soon"),
        ("paused", "yes"),
    ],
)
def test_a_bad_policy_is_a_400_naming_it(client, field, value):
    response = put(client, unique("bad"), {"every": 1000, field: value, "template": {"name": "x"}})
    assert response.status_code == 400
    assert response.get_json()["error"] == "validation_failed"
    assert field in str(response.get_json()["details"])


def test_pause_resume_and_trigger_of_another_tenants_scheduler_are_404(client):
    scheduler_id = unique("mine")
    assert put(client, scheduler_id, {"every": 60_000, "template": {"name": "test.echo"}})
    other = bearer(tenant="globex", roles=("operator",))
    for action in ("pause", "resume", "trigger"):
        url = f"/api/v1/schedulers/{scheduler_id}/{action}"
        assert client.post(url, headers=other).status_code == 404
        assert client.post(url, headers=bearer()).status_code == 403  # not an operator
    client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)


# --- catch-up: last, as it stops the beats ----------------------------------------------------


def test_after_beat_was_stopped_catch_up_fires_the_earliest_the_latest_or_all(client, beats):
    # Given three schedulers every 1 s, one per catch-up, that fired before the beats stopped
    ids = {mode: unique(mode) for mode in ("earliest", "latest", "all")}
    for mode, scheduler_id in ids.items():
        body = {"every": 1000, "catchUp": mode, "template": {"name": "test.echo"}}
        if mode == "all":
            body["catchUpWindow"] = 60_000  # required with all: a bound on what fires late
        assert put(client, scheduler_id, body).status_code == 200
    wait_for(lambda: all(len(fired("acme", i)) >= 2 for i in ids.values()), timeout=10)
    # When every beat is stopped for 5 s
    for beat in beats:
        beat.stop()
    last = {mode: slot(fired("acme", i)[-1]) for mode, i in ids.items()}
    time.sleep(5)
    back = datetime.now(UTC)
    for beat in beats:
        beat.start()
    wait_for(lambda: all(slot(fired("acme", i)[-1]) > back for i in ids.values()), timeout=20)
    for scheduler_id in ids.values():
        client.delete(f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR)
    after = {
        mode: [slot(j) for j in fired("acme", i) if slot(j) > last[mode]] for mode, i in ids.items()
    }
    # Then earliest (the default, as before): the first slot missed, then the next after now
    earliest = after["earliest"]
    assert earliest[0] == last["earliest"] + timedelta(seconds=1)
    assert earliest[1] > back, earliest
    # latest: one fire for the downtime, its last slot (none of the slots before it)
    latest = after["latest"]
    assert latest[0] >= back - timedelta(seconds=1), (last["latest"], latest, back)
    assert all(b - a == timedelta(seconds=1) for a, b in pairwise(latest)), latest
    # all: every slot missed, once each, in turn
    every = after["all"]
    assert every[0] == last["all"] + timedelta(seconds=1)
    assert len(every) >= 6 and all(b - a == timedelta(seconds=1) for a, b in pairwise(every))
