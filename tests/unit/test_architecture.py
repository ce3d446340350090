"""The job layer's architecture holds: layered packages, no cycles, nothing flat.

``lint-imports`` checks the contracts in ``pyproject.toml`` (``[tool.importlinter]``):
the packages of ``tasks/jobs/`` import only from the layers below them, no two
modules of a package import each other in a cycle, the generic layer does not
import the seed apps, and ``tasks/`` never imports ``web``.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.stack import PROJECT_ROOT

JOBS = PROJECT_ROOT / "tasks" / "jobs"


def contracts() -> list[dict]:
    config = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    found: list[dict] = config["tool"]["importlinter"]["contracts"]
    return found


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-2000:]


def test_every_package_of_the_job_layer_is_a_layer_and_nothing_lies_flat():
    packages = {p.name for p in JOBS.iterdir() if (p / "__init__.py").exists()}
    [layered] = [c for c in contracts() if c["type"] == "layers"]
    layers = {name.removeprefix("tasks.jobs.") for name in layered["layers"]}
    assert packages == layers, (packages, layers)
    flat = sorted(p.name for p in JOBS.glob("*.py") if p.name != "__init__.py")
    assert flat == [], f"modules at tasks/jobs/'s top level belong in a layer: {flat}"


def test_the_init_docstring_lists_the_layers_in_their_order():
    import tasks.jobs

    doc = tasks.jobs.__doc__ or ""
    [layered] = [c for c in contracts() if c["type"] == "layers"]
    named = [name.removeprefix("tasks.jobs.") + "/" for name in layered["layers"]]
    positions = [doc.find(f"``{name}``") for name in named]
    assert all(p >= 0 for p in positions), dict(zip(named, positions, strict=True))
    assert positions == sorted(positions), dict(zip(named, positions, strict=True))
