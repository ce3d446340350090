"""compose.yaml runs the same parts as ``keel up`` from one image (the Dockerfile: the wheel),
on official images by default. Static checks; tests/container runs it for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from keel.stack import PROJECT_ROOT

CORE = {"postgres", "redis", "migrate", "web", "worker", "beat", "flower"}
KEEL_SERVICES = ("migrate", "web", "worker", "beat", "flower", "sandbox")


def spec() -> dict:
    return yaml.safe_load((PROJECT_ROOT / "compose.yaml").read_text())


def test_compose_has_every_part_and_the_profiles():
    services = spec()["services"]
    default = {name for name, service in services.items() if not service.get("profiles")}
    assert default == CORE
    assert services["sandbox"]["profiles"] == ["demo"]
    assert services["rabbitmq"]["profiles"] == ["rabbitmq"]
    # Official images by default, another registry's (or a stand-in) through a variable
    for name, variable, official in (
        ("postgres", "KEEL_POSTGRES_IMAGE", "postgres:16"),
        ("redis", "KEEL_REDIS_IMAGE", "redis:7"),
        ("rabbitmq", "KEEL_RABBITMQ_IMAGE", "rabbitmq:3-management"),
    ):
        assert services[name]["image"] == f"${{{variable}:-{official}}}"
    assert services["migrate"]["command"] == ["keel", "db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["worker"]["command"][:4] == ["celery", "-A", "keel", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "keel", "beat"]
    assert services["sandbox"]["command"][:2] == ["keel", "provider-sandbox"]
    # Flower as `keel up` runs it: its /metrics and /healthcheck behind its password
    assert services["flower"]["command"][:3] == ["python", "-m", "keel.flower"]


def test_every_keel_service_runs_the_one_image_built_from_the_dockerfile():
    services = spec()["services"]
    for name in KEEL_SERVICES:
        service = services[name]
        assert service["image"] == "${KEEL_IMAGE:-keel:latest}", name
        assert service["build"]["context"] == "."
        assert service["build"]["args"]["BASE_IMAGE"] == "${KEEL_BASE_IMAGE:-python:3.11-slim}"
        # an init as PID 1: `docker stop` reaches processes without a SIGTERM handler
        assert service["init"] is True, name
    for name in ("web", "worker", "beat", "flower"):
        env = services[name]["environment"]
        assert env["KEEL_DATABASE_URL"].startswith("postgresql://")
        assert env["KEEL_REDIS_URL"].startswith("redis://")
        assert env["KEEL_BROKER_URL"] == "${KEEL_BROKER_URL:-}"  # empty: through Redis
        # without the demo profile there is no provider: the reports app only, by default
        assert env["KEEL_BUILTIN_JOBS"] == "${KEEL_BUILTIN_JOBS-reports}"
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_secrets_come_from_the_environment_only():
    services = spec()["services"]
    for name in ("web", "worker", "beat", "flower", "migrate"):
        env = services[name]["environment"]
        assert env["KEEL_SECRET_KEY"].startswith("${KEEL_SECRET_KEY:?")
    # Flower's password in its environment, not on its command line, under the documented names
    flower = services["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith(
        "${KEEL_FLOWER_USER:-keel}:${KEEL_FLOWER_PASSWORD:?"
    )
    assert not any("basic-auth" in arg for arg in flower["command"])
    docker_page = (PROJECT_ROOT / "docs" / "operations" / "docker.md").read_text()
    assert "KEEL_FLOWER_USER" in docker_page and "KEEL_FLOWER_PASSWORD" in docker_page
    for page in [PROJECT_ROOT / "README.md", *(PROJECT_ROOT / "docs").rglob("*.md")]:
        text = page.read_text()
        assert "FLOWER_PASSWORD=" not in text.replace("KEEL_FLOWER_PASSWORD=", ""), page


def test_health_checks():
    services = spec()["services"]
    # web's liveness (not /readyz: a down worker must not get the API restarted)
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    # Flower's health check behind its password: the probe reads it with FLOWER_BASIC_AUTH
    assert services["flower"]["healthcheck"]["test"] == [
        "CMD",
        "python",
        "-m",
        "keel.flower",
        "probe",
        "http://127.0.0.1:5555/healthcheck",
    ]
    # a fresh local heartbeat of the worker and of beat
    for name in ("worker", "beat"):
        assert services[name]["healthcheck"]["test"] == [
            "CMD",
            "python",
            "-m",
            "tasks.jobs.upkeep.healthcheck",
            name,
        ]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "redis-cli" in " ".join(services["redis"]["healthcheck"]["test"])


def test_ports_are_variables_with_keels_defaults():
    services = spec()["services"]
    assert services["web"]["ports"] == ["${KEEL_WEB_PORT:-8000}:8000"]
    assert services["flower"]["ports"] == ["${KEEL_FLOWER_PORT:-5555}:5555"]
    assert services["sandbox"]["ports"] == ["${KEEL_SANDBOX_PORT:-8025}:8025"]


def test_the_dockerfile_builds_the_wheel_and_runs_it_as_a_user():
    dockerfile = (PROJECT_ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip()]
    instructions = [line for line in lines if not line.startswith("#")]
    assert instructions[0] == "ARG BASE_IMAGE=python:3.11-slim"
    froms = [line for line in instructions if line.startswith("FROM ")]
    assert froms == ["FROM ${BASE_IMAGE} AS wheel", "FROM ${BASE_IMAGE}"]
    runtime = instructions[instructions.index("FROM ${BASE_IMAGE}") :]
    # the runtime stage takes the lock file and the wheels only: no source folder of the tree
    copies = [line for line in runtime if line.startswith(("COPY", "ADD"))]
    assert copies == [
        "COPY requirements/image.lock /tmp/image.lock",
        "COPY --from=wheel /dist/ /tmp/dist/",
    ]
    [user] = [line for line in runtime if line.startswith("USER ")]
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert "pip wheel" in dockerfile and "keel_jobs-*.whl" in dockerfile
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".keel", "bench/results"} <= set(ignored)


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="docker-compose is not installed")
def test_docker_compose_validates_every_profile_and_refuses_without_secrets():
    command = ["docker-compose", "-f", str(PROJECT_ROOT / "compose.yaml")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "FLOWER_"))}
    refused = subprocess.run(
        [*command, "config", "-q"], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "KEEL_SECRET_KEY" in refused.stderr
    env.update(KEEL_SECRET_KEY="k" * 64, KEEL_FLOWER_PASSWORD="p" * 24)
    for profiles in ([], ["--profile", "demo"], ["--profile", "rabbitmq"]):
        result = subprocess.run(
            [*command, *profiles, "config"], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert re.search(r"FLOWER_BASIC_AUTH: keel:p{24}", result.stdout)
