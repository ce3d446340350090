"""Pausing a queue with real workers consuming it (``tasks.jobs.intake.pauses``): what is
added meanwhile waits, with no attempt spent, through every worker's restart; resumed, each job
runs once; one tenant's pause holds its own jobs only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.jobs.store import pauses as pauses_store
from tasks.platform.db import transaction
from tests.support import jobs as _test_jobs  # noqa: F401  (test.pausable, in this process too)
from tests.support.client import bearer, record, unique, wait_state
from tests.support.stack import PROJECT_ROOT, WorkerProcess, wait_for

pytestmark = pytest.mark.stack  # starts workers of its own

QUEUE = "pausable"
KEEL = str(Path(sys.executable).with_name("keel"))


@pytest.fixture(scope="module")
def workers(stack) -> Iterator[list[WorkerProcess]]:
    started = [WorkerProcess(stack.home, unique(f"pause{i}"), concurrency=2) for i in range(2)]
    for worker in started:
        worker.queues = QUEUE
        worker.start()
    yield started
    for worker in started:
        worker.stop()


def keel(*args: str) -> str:
    env = {**os.environ, "KEEL_JOB_MODULES": "tests.support.jobs"}
    done = subprocess.run(
        [KEEL, *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def submit(client, tenant: str, **opts) -> str:
    body = {"name": "test.pausable", "data": {"n": unique()}, "opts": opts}
    response = client.post("/api/v1/jobs", json=body, headers=bearer(tenant))
    assert response.status_code == 202, response.get_json()
    return response.get_json()["jobId"]


def held(job_ids: list[str]) -> set[str]:
    with transaction() as session:
        return set(pauses_store.held_ids(session, job_ids))


def assert_waiting_untouched(job_ids: list[str]) -> None:
    for job_id in job_ids:
        job = record(job_id)
        assert job is not None and job["state"] == "waiting", job
        assert job["attemptsStarted"] == 0, job


def test_a_paused_queue_holds_its_jobs_through_a_restart_and_runs_each_once_resumed(
    workers, client
):
    # Given the queue paused for every tenant, with two workers consuming it
    assert "paused for every tenant's jobs" in keel("queues", "pause", QUEUE)
    time.sleep(1)  # (every worker honours it within a second: from now on)
    # When jobs are added over the next 3 s, and one delayed 1 s
    added = [submit(client, "acme", delay=1000)]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        added.append(submit(client, "acme"))
        time.sleep(0.2)
    # Then the workers take every message (the delayed job's once due) and hold the jobs
    wait_for(lambda: held(added) == set(added), timeout=30)
    assert_waiting_untouched(added)
    # and after every worker restarted, they run none of them, and hold what is added next
    for worker in workers:
        worker.stop()
    for worker in workers:
        worker.start()
    later = [submit(client, "acme") for _ in range(3)]
    wait_for(lambda: held(later) == set(later), timeout=30)
    added += later
    assert_waiting_untouched(added)
    assert '"queue": "pausable", "tenantId": ""' in keel("queues", "paused")
    # When the queue is resumed
    out = keel("queues", "resume", QUEUE)
    # (the workers' maintenance may publish some first: this call's count is not asserted)
    assert "queue pausable resumed for every tenant's jobs" in out, out
    # Then every job completes, each after one run
    for job_id in added:
        job = wait_state(job_id, "completed", "failed", timeout=60)
        assert job["state"] == "completed" and job["attemptsStarted"] == 1, job
        assert len(job["runs"]) == 1, job["runs"]
    assert held(added) == set()


def test_a_tenants_pause_holds_its_own_jobs_and_no_one_elses(workers, client):
    acme, globex = unique("acme"), unique("globex")
    operator = bearer(acme, "ops", ("operator",))
    # Given acme's operator pausing acme's jobs on the queue
    paused = client.post(f"/api/v1/queues/{QUEUE}/pause", headers=operator)
    assert paused.status_code == 200, paused.get_json()
    assert paused.get_json() == {"queue": QUEUE, "paused": True, "changed": True, "released": 0}
    shown = client.get("/api/v1/queues", headers=operator).get_json()["paused"]
    assert [(p["queue"], p["scope"], p["pausedBy"]) for p in shown] == [(QUEUE, "tenant", "ops")]
    time.sleep(1)
    # When both tenants add jobs on it
    acme_jobs = [submit(client, acme) for _ in range(5)]
    globex_jobs = [submit(client, globex) for _ in range(5)]
    # Then globex's run, acme's are held
    for job_id in globex_jobs:
        assert wait_state(job_id, "completed", "failed", timeout=30)["state"] == "completed"
    wait_for(lambda: held(acme_jobs) == set(acme_jobs), timeout=30)
    assert_waiting_untouched(acme_jobs)
    # and globex sees no pause, and cannot lift acme's
    globex_ops = bearer(globex, "ops", ("operator",))
    assert client.get("/api/v1/queues", headers=globex_ops).get_json()["paused"] == []
    lifted = client.post(f"/api/v1/queues/{QUEUE}/resume", headers=globex_ops).get_json()
    assert lifted["changed"] is False and lifted["released"] == 0
    assert held(acme_jobs) == set(acme_jobs)
    # When acme's operator resumes
    resumed = client.post(f"/api/v1/queues/{QUEUE}/resume", headers=operator).get_json()
    assert (resumed["paused"], resumed["changed"]) == (False, True), resumed
    assert 0 <= resumed["released"] <= len(acme_jobs)  # (maintenance may publish some first)
    # Then acme's jobs run, once each
    for job_id in acme_jobs:
        job = wait_state(job_id, "completed", "failed", timeout=30)
        assert job["state"] == "completed" and job["attemptsStarted"] == 1, job


def test_a_message_without_a_record_and_a_chain_step_are_held_too(workers, worker, client):
    from celery import chain

    from tasks.celery import app

    # Given the queue paused for every tenant
    assert "paused for every tenant's jobs" in keel("queues", "pause", QUEUE)
    time.sleep(1)
    # When a message arrives that another Celery app sent by name (no record, no Keel
    # header), and a chain's step on the paused queue is recorded and published inside
    # the transaction that completes its parent (which runs on another queue)
    foreign = unique("foreign")
    app.send_task("test.pausable", kwargs={"n": foreign}, task_id=foreign, queue=QUEUE)
    step = unique("step")
    chain(
        app.signature("test.echo", kwargs={"n": 1}, queue="default", immutable=True),
        app.signature(
            "test.pausable", kwargs={"n": step}, task_id=step, queue=QUEUE, immutable=True
        ),
    ).apply_async()
    # Then the foreign one is recorded on arrival and held, and so is the chain's step
    wait_for(lambda: held([foreign, step]) == {foreign, step}, timeout=30)
    assert_waiting_untouched([foreign, step])
    # And resumed, each runs once
    keel("queues", "resume", QUEUE)
    for job_id in (foreign, step):
        job = wait_state(job_id, "completed", "failed", timeout=60)
        assert job["state"] == "completed" and job["attemptsStarted"] == 1, job
