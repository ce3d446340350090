"""Flower shows Keel's jobs: ``celery -A tasks flower`` against a running stack."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from keel.embedded import free_port
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import PROJECT_ROOT, wait_for

AUTH = ("keel", "flower-test-password")


@pytest.fixture(scope="module")
def flower(stack, worker):
    """Flower on a free port with basic auth, once its event receiver hears the worker."""
    port = free_port()
    log = (stack.home / "flower.log").open("ab")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            f"--basic-auth={AUTH[0]}:{AUTH[1]}",
        ],
        cwd=PROJECT_ROOT,
        env=dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def hears_the_worker() -> bool:
        assert process.poll() is None, (stack.home / "flower.log").read_text()[-3000:]
        try:
            alive = requests.get(f"{url}/api/workers?status=1", auth=AUTH, timeout=2).json()
        except (requests.RequestException, ValueError):
            return False
        return any(name.startswith(f"{worker.name}@") and up for name, up in alive.items())

    try:
        wait_for(hears_the_worker, timeout=30, interval=0.3)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_flower_lists_a_completed_report_job_by_its_job_id(client, flower):
    # Given Flower watching the stack's events
    # When a report job runs to completion
    response = client.post(
        "/api/v1/reports", json={"reportId": unique(), "rows": 11}, headers=bearer()
    )
    job_id = response.get_json()["jobId"]
    wait_state(job_id, "completed")

    # Then Flower's API lists it as a succeeded report.generate task whose id is the job id
    def listed() -> dict | None:
        tasks = requests.get(f"{flower}/api/tasks", auth=AUTH, timeout=5).json()
        task = tasks.get(job_id)
        return task if task and task.get("state") == "SUCCESS" else None

    task = wait_for(listed, timeout=20, interval=0.3)
    assert task["name"] == "report.generate"
    assert task["uuid"] == job_id
    assert "generatedRows" in (task.get("result") or "")


def test_an_ignored_delivery_is_shown_as_ignored_and_nothing_stays_started(flower):
    from tasks.celery import app

    # Given a delivery that no record accepts (a wake-up for a job that does not exist)
    task_id = unique("ghost")
    app.send_task("test.echo", kwargs={}, task_id=task_id, queue="default", headers={"keel": "1"})

    # Then Flower shows it as IGNORED, not STARTED forever
    def shown() -> dict | None:
        task = requests.get(f"{flower}/api/tasks", auth=AUTH, timeout=5).json().get(task_id)
        waiting = (None, "PENDING", "RECEIVED", "STARTED")
        return task if task and task.get("state") not in waiting else None

    assert wait_for(shown, timeout=60, interval=0.3)["state"] == "IGNORED"

    # And once the stack is idle, no task is left STARTED
    def none_started() -> bool:
        started = requests.get(
            f"{flower}/api/tasks", params={"state": "STARTED"}, auth=AUTH, timeout=5
        ).json()
        return not started

    wait_for(none_started, timeout=60, interval=1)


def test_flower_requires_its_basic_auth(flower):
    assert requests.get(f"{flower}/api/tasks", timeout=5).status_code == 401
