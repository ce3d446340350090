"""A Celery project of its own, made a Keel app with ``keel.install(app)`` (examples/plain_celery).

Its app keeps its own configuration (JSON, its queues, a route to a queue of its own, a
``beat_schedule``); its unchanged tasks, called with ``.delay()`` from the project's
own process and run by ``celery -A proj worker``, are Keel jobs: recorded, retried with
backoff through the record, routed as the app routes them, shown to their owner by Keel's
API and dashboard, and ``AsyncResult.get()`` returns their results.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from tasks.jobs.model.models import JobRecord
from tasks.jobs.schedule.schedulers import fire_prefix
from tasks.platform.db import transaction
from tests.support.client import bearer, record, unique, wait_state, waits_between_runs
from tests.support.stack import PROJECT_ROOT, BeatProcess, WorkerProcess, wait_for
from tests.support.ui import PAGE, signed_in

PROJECT = PROJECT_ROOT / "examples" / "plain_celery"
WINDOW_S = 10

# The project's process: its own app, set up for Keel by importing proj.celery.
CALLS = """
import json
from proj.tasks import add, flaky, resize
from proj.celery import app
import keel

sent = {"add": add.delay(2, 3), "flaky": flaky.delay(2), "resize": resize.delay("cat.png")}
print(json.dumps({
    "ids": {name: result.id for name, result in sent.items()},
    "add": sent["add"].get(timeout=60),
    "resize": sent["resize"].get(timeout=60),
    "app": keel.app.main,
    "keel_task": isinstance(add, keel.KeelTask),
    "serializer": app.conf.task_serializer,
    "routes": app.conf.task_routes,
    "beat": sorted(app.conf.beat_schedule),
    "acks_late": app.conf.task_acks_late,
}))
"""

pytestmark = pytest.mark.stack  # starts worker processes of its own


@pytest.fixture(scope="module")
def project_worker(stack):
    env = {"PYTHONPATH": str(PROJECT), "KEEL_BUILTIN_JOBS": "none"}
    process = WorkerProcess(
        stack.home, "proj", app="proj", cwd=PROJECT, include=None, extra_env=env
    )
    process.start()
    yield process
    process.stop()


def python_in_project(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a process of the project's own (its folder, its import path)."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "KEEL_BUILTIN_JOBS": "none"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_in_project(code: str) -> dict:
    done = python_in_project(code)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_projects_own_app_runs_its_unchanged_tasks_as_keel_jobs(project_worker):
    seen = run_in_project(CALLS)
    # The app is the project's, with its own settings kept and Keel's it must own
    assert seen["app"] == "proj"
    assert seen["keel_task"] is True, seen
    assert seen["serializer"] == "json" and seen["acks_late"] is True
    assert seen["routes"] == {"proj.tasks.resize": {"queue": "images"}}
    assert seen["beat"] == ["tick-every-minute"]
    # AsyncResult.get() returns what the tasks returned
    assert (seen["add"], seen["resize"]) == (5, {"resized": "cat.png"})
    ids = seen["ids"]
    # Each call is a recorded job, on the queue the app routes it to
    added = wait_state(ids["add"], "completed", "failed", timeout=30)
    assert (added["state"], added["name"], added["result"]) == ("completed", "proj.tasks.add", 5)
    assert added["queue"] == "celery", added
    assert record(ids["resize"])["queue"] == "images"
    # autoretry_for with retry_backoff=1 (no jitter): two failed runs, then completed, after
    # waits of 1 s and 2 s (Celery's countdowns; the record's runs show them)
    flaky = wait_state(ids["flaky"], "completed", "failed", timeout=60)
    assert flaky["state"] == "completed", flaky
    assert flaky["result"] == {"retries": 2}, flaky
    assert (flaky["attemptsMade"], flaky["attemptsStarted"]) == (2, 3), flaky
    waits = waits_between_runs(flaky)
    assert len(waits) == 2, waits
    assert 0.9 <= waits[0] <= 6 and 1.9 <= waits[1] <= 7, waits


OWNED_CALL = """
import json, sys
from proj.tasks import add
import keel

with keel.acting_as(keel.Owner(sys.argv[1], "alice")):  # the project's own user, say
    result = add.delay(40, 2)
print(json.dumps({"id": result.id, "value": result.get(timeout=60)}))
"""


def test_the_projects_jobs_are_in_keels_api_and_dashboard(project_worker, app, client):
    tenant = unique("proj")
    done = python_in_project(OWNED_CALL.replace("sys.argv[1]", repr(tenant)))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["value"] == 42
    # The API shows the job to its owner, and lists it by the project's task name
    shown = client.get(f"/api/v1/jobs/{seen['id']}", headers=bearer(tenant, "alice"))
    assert shown.status_code == 200, shown.get_data(as_text=True)
    job = shown.get_json()
    assert (job["name"], job["queue"], job["state"], job["result"]) == (
        "proj.tasks.add",
        "celery",
        "completed",
        42,
    ), job
    listed = client.get(
        "/api/v1/jobs?name=proj.tasks.add", headers=bearer(tenant, "alice")
    ).get_json()
    assert [item["jobId"] for item in listed["jobs"]] == [seen["id"]], listed
    # and so does the dashboard, to the same user; another tenant's user gets a 404
    page = signed_in(app, tenant, "alice").get(f"/ui/jobs/{seen['id']}", headers=PAGE)
    assert page.status_code == 200
    assert "proj.tasks.add" in page.get_data(as_text=True)
    stranger = signed_in(app, unique("other"), "alice").get(f"/ui/jobs/{seen['id']}", headers=PAGE)
    assert stranger.status_code == 404


ASYNC_CALLS = """
import json, sys
from proj.tasks import fetch

up, down = fetch.delay(sys.argv[1]), fetch.delay(sys.argv[2])
print(json.dumps({"up": up.id, "status": up.get(timeout=60), "down": down.id}))
"""


def test_the_projects_async_task_awaits_http_and_is_retried_through_its_record(
    project_worker, sandbox
):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    done = python_in_project(
        ASYNC_CALLS.replace("sys.argv[1]", repr(f"{sandbox.url}/health")).replace(
            "sys.argv[2]", repr(closed)
        )
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == 200
    assert record(seen["up"])["name"] == "proj.tasks.fetch"
    # A refused connection is httpx's TransportError: autoretry_for retries it three times
    down = wait_state(seen["down"], "failed", "completed", timeout=60)
    assert (down["state"], down["attemptsStarted"]) == ("failed", 4), down
    assert down["runs"][-1]["exception"]["exc_type"] == "ConnectError", down


def test_a_setting_keel_cannot_run_with_is_refused_in_one_line(stack):
    code = (
        "from celery import Celery\nimport keel\n"
        "app = Celery('proj')\napp.conf.task_serializer = 'pickle'\nkeel.install(app)\n"
        "app.conf.task_serializer\n"
    )
    done = python_in_project(code)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "task_serializer='pickle'" in last and "Keel needs 'json'" in last, last


def synced(beat: BeatProcess) -> bool:
    return "beat_schedule: " in beat.log_path.read_text(errors="replace")


def tick_fires() -> list[str]:
    prefix = fire_prefix("", "beat:tick-every-second")
    with transaction() as session:
        found = session.scalars(select(JobRecord.id).where(JobRecord.id.startswith(prefix)))
        return list(found.all())


def test_two_beats_of_the_project_fire_its_schedule_once_per_slot(project_worker, stack):
    env = {"PYTHONPATH": str(PROJECT), "KEEL_BUILTIN_JOBS": "none"}
    beats = [
        BeatProcess(stack.home, f"proj-{n}", app="tests.support.plain_celery_beat", extra_env=env)
        for n in range(2)
    ]
    try:
        for beat in beats:
            beat.start()
            wait_for(lambda b=beat: synced(b), timeout=60)  # its entries are stored
        first = wait_for(tick_fires, timeout=60)
        time.sleep(WINDOW_S + 1)
        times = sorted(int(job_id.rsplit(":", 1)[1]) for job_id in tick_fires())
        in_window = [t for t in times if t < times[0] + WINDOW_S * 1000]
        # One job per second in ten seconds, at distinct times, though two beats fire it
        assert 9 <= len(in_window) <= 11, in_window
        assert len(set(in_window)) == len(in_window)
        job = wait_state(first[0], "completed", "failed", timeout=30)
        assert (job["state"], job["result"]) == ("completed", "tick"), job
    finally:
        for beat in beats:
            beat.stop()
