"""``keel up``, nothing configured: the README's first screen (docs/operations/index.md), for real.

These tests share one running stack (the ``keel_up`` fixture); the ones that
kill a stack outright are in ``test_supervisor.py``.
"""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import requests

from tests.support.keel_up import KEEL, KeelUp, alive
from tests.support.stack import PROJECT_ROOT, wait_for


def user_token(up: KeelUp) -> dict[str, str]:
    return {"Authorization": f"Bearer {up.token()}"}


def run_report(up: KeelUp, rows: int = 1000, timeout: float = 60) -> dict:
    """POST a report through the stack's web child and wait until it completed."""
    headers = user_token(up)
    accepted = requests.post(
        f"{up.web}/api/v1/reports",
        json={"reportId": f"q{time.time_ns()}", "rows": rows},
        headers=headers,
        timeout=10,
    )
    assert accepted.status_code == 202, accepted.text

    def completed() -> dict | None:
        url = up.web + accepted.json()["statusUrl"]
        job = requests.get(url, headers=headers, timeout=10).json()
        return job if job["state"] == "completed" else None

    job = wait_for(completed, timeout=timeout, interval=0.3)
    assert job["result"]["generatedRows"] == rows
    return {**job, "statusUrl": accepted.json()["statusUrl"]}


def test_keel_up_runs_the_readme_walk_through(keel_up: KeelUp):
    # Given `keel up` on a home with nothing configured, announced as up
    stack_env = keel_up.stack_env
    assert {"KEEL_DATABASE_URL", "KEEL_REDIS_URL", "KEEL_SECRET_KEY", "KEEL_WEB_URL"} <= set(
        stack_env
    )
    # Then it is ready right away, and a report runs to completion
    ready = requests.get(f"{keel_up.web}/readyz", timeout=5)
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"postgres": "ok", "redis": "ok"}
    job = run_report(keel_up)
    assert job["progress"]["percent"] == 100
    # And Flower answers with the password from the env file
    auth = (stack_env["KEEL_FLOWER_USER"], stack_env["KEEL_FLOWER_PASSWORD"])
    flower = f"http://127.0.0.1:{keel_up.env['KEEL_FLOWER_PORT']}/api/workers"
    wait_for(lambda: _ok(flower, auth), timeout=30, interval=0.5)
    assert requests.get(flower, timeout=5).status_code == 401
    # And its metrics and health check want the password too (Flower 2 serves them to anyone)
    for path in ("/metrics", "/healthcheck"):
        url = f"http://127.0.0.1:{keel_up.env['KEEL_FLOWER_PORT']}{path}"
        assert requests.get(url, timeout=5).status_code == 401, path
        assert requests.get(url, timeout=5, auth=auth).status_code == 200, path


def _ok(url: str, auth: tuple[str, str]) -> bool:
    try:
        return requests.get(url, timeout=2, auth=auth).ok
    except requests.RequestException:
        return False


def test_output_is_prefixed_with_each_childs_name_and_announced_once(keel_up: KeelUp):
    log = keel_up.log()
    for name in ("worker", "beat", "web", "flower", "sandbox"):
        assert f" {name:<8}| " in log, name
    assert log.count("Keel is up.") == 1


def test_a_second_keel_up_on_the_same_home_is_refused_at_once(keel_up: KeelUp):
    # Given a running stack and its env file
    env_file = keel_up.home / "env"
    before = env_file.read_bytes()
    # When a second `keel up` starts on the same home (other ports, so nothing else collides)
    env = {**keel_up.env, "KEEL_WEB_PORT": "1"}
    again = subprocess.run(
        [KEEL, "up"], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60
    )
    # Then it refuses, naming the running supervisor, and leaves the env file as it was
    assert again.returncode != 0
    assert f"pid {keel_up.process.pid}" in again.stderr, again.stderr
    assert "Keel is up" not in again.stdout
    assert env_file.read_bytes() == before
    # And the first stack still serves
    assert requests.get(f"{keel_up.web}/readyz", timeout=5).status_code == 200


def test_a_crashed_worker_is_restarted_and_jobs_still_complete(keel_up: KeelUp):
    # Given the stack's worker
    worker = keel_up.child("celery -A keel worker")
    # When it is killed
    worker.send_signal(signal.SIGKILL)
    # Then the supervisor logs the exit, starts a new one, and the stack keeps running
    wait_for(lambda: "worker restarted" in keel_up.log(), timeout=30, interval=0.3)
    assert keel_up.process.poll() is None
    assert keel_up.child("celery -A keel worker").pid != worker.pid
    assert "worker exited with code -9" in keel_up.log()
    run_report(keel_up, rows=50)


def test_a_killed_embedded_redis_is_restarted_and_reported_meanwhile(keel_up: KeelUp):
    # Given the stack's embedded Redis, and its supervisor held still so the outage lasts
    redis_server = keel_up.child("redis-server")
    supervisor = psutil.Process(keel_up.process.pid)
    supervisor.suspend()
    try:
        # When Redis is killed
        redis_server.send_signal(signal.SIGKILL)
        wait_for(lambda: not alive([redis_server]), timeout=10)
        # Then /readyz answers within 2 s: still ready (jobs are parked), Redis reported down
        started = time.monotonic()
        response = requests.get(f"{keel_up.web}/readyz", timeout=5)
        took = time.monotonic() - started
        # And `keel status` is unhealthy, naming Redis
        status = subprocess.run(
            [KEEL, "status"], env=keel_up.env, capture_output=True, text=True, timeout=60
        )
    finally:
        supervisor.resume()
    assert response.status_code == 200 and took < 2, (response.status_code, took)
    assert response.json()["checks"]["redis"] == "unavailable (ConnectionError)", response.text
    assert status.returncode == 1, status.stdout + status.stderr
    assert "FAIL  redis" in status.stdout, status.stdout
    # And the supervisor starts it again: ready again, and new jobs complete
    wait_for(lambda: "redis restarted" in keel_up.log(), timeout=30, interval=0.3)
    wait_for(
        lambda: requests.get(f"{keel_up.web}/readyz", timeout=5).json()["checks"]["redis"] == "ok",
        timeout=30,
    )
    run_report(keel_up, rows=60)


def test_keel_ui_link_signs_in_to_the_running_stacks_dashboard(keel_up: KeelUp):
    # Given the link `keel ui-link` prints next to a running stack (its URL from $KEEL_HOME/env)
    link = subprocess.run(
        [KEEL, "ui-link", "--tenant", "acme", "--user", "olga", "--role", "operator"],
        env=keel_up.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert link.startswith(f"{keel_up.web}/ui/login/")
    assert f"{keel_up.web}/ui" in keel_up.log()  # announced with the other URLs
    # When a browser opens it, the stack's web app (gunicorn) signs it in
    browser = requests.Session()
    signed_in = browser.get(link, allow_redirects=False, timeout=10)
    assert signed_in.status_code == 303, signed_in.text
    page = browser.get(f"{keel_up.web}/ui/queues", headers={"Accept": "text/html"}, timeout=10)
    assert page.status_code == 200 and "Queues" in page.text
    # And the link is spent for every process of the web app, not only the one that took it
    assert [requests.get(link, timeout=10).status_code for _ in range(4)] == [401] * 4
    # And the API docs page's assets come from the stack itself
    asset = requests.get(f"{keel_up.web}/api/v1/docs/assets/swagger-ui-bundle.js", timeout=10)
    assert asset.status_code == 200 and "SwaggerUIBundle" in asset.text
