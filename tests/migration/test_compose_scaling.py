"""``docker compose up --scale worker=3`` runs three workers that clash on nothing.

There is no Docker engine in CI, so the file is checked for what would make
replicas collide: a published port (only one replica could bind it), a fixed
container name or hostname (Compose refuses the first; the second gives every
replica the same Celery node name, ``celery@<hostname>``), a worker command
with a fixed node name, or a volume the replicas would share.
"""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yaml"


def test_workers_scale_without_port_name_or_volume_clashes():
    worker = yaml.safe_load(COMPOSE.read_text())["services"]["worker"]
    assert worker["command"][:4] == ["celery", "-A", "keel", "worker"]
    assert not {"ports", "container_name", "hostname", "volumes"} & set(worker), worker
    node_name = [a for a in worker["command"] if a in ("-n", "--hostname") or a.startswith("-n")]
    assert not node_name, "a fixed node name would be shared by every replica"
    # every replica reaches the servers by service name, like any other host would
    assert "@postgres:" in worker["environment"]["KEEL_DATABASE_URL"]
    assert worker["environment"]["KEEL_REDIS_URL"].startswith("redis://redis:")
