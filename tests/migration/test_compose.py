"""compose.yaml runs the same parts as ``keel up``, on official images."""

from __future__ import annotations

import yaml

from keel.stack import PROJECT_ROOT


def test_compose_has_every_part_on_official_images():
    spec = yaml.safe_load((PROJECT_ROOT / "compose.yaml").read_text())
    services = spec["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "flower"} <= set(services)
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["redis"]["image"].startswith("redis:")
    assert services["migrate"]["command"] == ["keel", "db", "upgrade"]
    assert services["worker"]["command"][:4] == ["celery", "-A", "tasks", "worker"]
    # Flower's password in its environment, not on its command line
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_USER")
    assert not any("basic-auth" in arg for arg in services["flower"]["command"])
    # health checks: web's liveness, a fresh heartbeat of the worker and of beat
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    for name in ("worker", "beat"):
        assert services[name]["healthcheck"]["test"] == [
            "CMD",
            "python",
            "-m",
            "tasks.jobs.healthcheck",
            name,
        ]
    for name in ("web", "worker", "flower"):
        env = services[name]["environment"]
        assert env["KEEL_DATABASE_URL"].startswith("postgresql://")
        assert env["KEEL_REDIS_URL"].startswith("redis://")
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
