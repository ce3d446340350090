"""Flower shows Keel's jobs, run as Keel runs it (``python -m keel.flower``: ``celery -A tasks
flower`` whose ``/metrics`` and ``/healthcheck`` want its credentials too) against a running
stack."""

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
# As `keel up` and compose give it: in the environment, never on the command line.
FLOWER_ENV = {**os.environ, "FLOWER_BASIC_AUTH": f"{AUTH[0]}:{AUTH[1]}"}


@pytest.fixture(scope="module")
def flower(stack, worker):
    """Flower on a free port with basic auth, once its event receiver hears the worker."""
    port = free_port()
    log = (stack.home / "flower.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "keel.flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=PROJECT_ROOT,
        env=FLOWER_ENV,
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


@pytest.mark.parametrize("path", ["/metrics", "/healthcheck"])
def test_flowers_metrics_and_healthcheck_want_its_credentials(flower, path):
    # Flower 2 serves these to anyone (task names, worker names and pids): Keel's does not
    for auth in (None, (AUTH[0], "not-the-password"), ("someone", AUTH[1])):
        refused = requests.get(f"{flower}{path}", auth=auth, timeout=5)
        assert refused.status_code == 401, (auth, refused.text[:200])
        assert refused.headers["WWW-Authenticate"].startswith("Basic")
        assert "flower_" not in refused.text and "@" not in refused.text
    answered = requests.get(f"{flower}{path}", auth=AUTH, timeout=5)
    assert answered.status_code == 200
    expected = "flower_events_total" if path == "/metrics" else "OK"
    assert expected in answered.text


def probe(url: str, **env: str) -> subprocess.CompletedProcess:
    """The documented health probe (compose's): ``python -m keel.flower probe URL``."""
    return subprocess.run(
        [sys.executable, "-m", "keel.flower", "probe", url],
        cwd=PROJECT_ROOT,
        env={**FLOWER_ENV, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_probe_reads_the_healthcheck_with_flowers_credentials(flower):
    # With Flower's own FLOWER_BASIC_AUTH (its environment, as in compose): healthy
    healthy = probe(f"{flower}/healthcheck")
    assert healthy.returncode == 0, healthy.stderr
    # With a wrong password, or none: one line naming the answer, and unhealthy
    wrong = probe(f"{flower}/healthcheck", FLOWER_BASIC_AUTH=f"{AUTH[0]}:wrong")
    assert wrong.returncode == 1 and "401" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1 and "wrong" not in wrong.stderr
    unset = probe(f"{flower}/healthcheck", FLOWER_BASIC_AUTH="")
    assert unset.returncode == 1 and "401" in unset.stderr, unset.stderr
    # And nothing answering is unhealthy too
    gone = probe(f"http://127.0.0.1:{free_port()}/healthcheck")
    assert gone.returncode == 1 and gone.stderr.strip(), gone.stderr


@pytest.fixture
def flower_behind_oauth(stack):
    """Keel's Flower behind OAuth instead of a password (the team's SSO: docs/dashboard.md)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    env.update(
        FLOWER_AUTH=".*@example.com",
        FLOWER_AUTH_PROVIDER="flower.views.auth.GoogleAuth2LoginHandler",
        FLOWER_OAUTH2_KEY="keel-test-client",
        FLOWER_OAUTH2_SECRET="keel-test-secret",
        FLOWER_OAUTH2_REDIRECT_URI=f"{url}/login",
    )
    log = (stack.home / "flower-oauth.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "keel.flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def answers() -> bool:
        assert process.poll() is None, (stack.home / "flower-oauth.log").read_text()[-3000:]
        try:
            requests.get(f"{url}/healthcheck", allow_redirects=False, timeout=2)
        except requests.RequestException:
            return False
        return True

    try:
        wait_for(answers, timeout=30, interval=0.3)
        yield url, env
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_behind_oauth_metrics_and_healthcheck_send_to_the_sign_in(flower_behind_oauth):
    url, env = flower_behind_oauth
    for path in ("/metrics", "/healthcheck"):
        answer = requests.get(f"{url}{path}", allow_redirects=False, timeout=5)
        assert answer.status_code == 302, (path, answer.text[:200])
        assert answer.headers["Location"].startswith("/login?next="), answer.headers
        assert "flower_" not in answer.text
    # and the probe, which has no sign-in, counts that as Flower being up
    up = subprocess.run(
        [sys.executable, "-m", "keel.flower", "probe", f"{url}/healthcheck"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert up.returncode == 0, up.stderr
