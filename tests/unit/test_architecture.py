"""The job layer's architecture holds: layered packages, no cycles, nothing flat.

``lint-imports`` checks the contracts in ``pyproject.toml`` (``[tool.importlinter]``):
the packages of ``tasks/jobs/`` import only from the layers below them, no two
modules of a package import each other in a cycle, the generic layer does not
import the seed apps, and ``tasks/`` never imports ``web``.
"""

from __future__ import annotations

import re
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


# The tables the job store owns (``tasks.jobs.store``): every write to them is one of its
# named operations. The job schedulers' table is the schedule layer's (``schedule/``).
STORE_TABLES = {
    "jobs",
    "dedup_claims",
    "job_retry_audit",
    "job_actions",
    "failed_jobs_archive",
    "job_counts",
    "job_count_deltas",
    "queue_pauses",
    "job_logs",
    "job_waits",
    "held_jobs",
    "bulk_actions",
}
STORE_MODELS = {
    "JobRecord",
    "DedupClaim",
    "RetryAudit",
    "JobAction",
    "ArchivedJob",
    "JobCount",
    "JobCountDelta",
    "QueuePause",
    "JobLogLine",
    "JobWait",
    "HeldJob",
    "BulkAction",
}


def writes_outside_the_store() -> list[str]:
    """Each line outside ``tasks/jobs/store`` (and the migrations) that writes a store table:
    SQL (``INSERT INTO``, ``UPDATE``, ``DELETE FROM``) or the ORM (``session.add`` of one of
    its models, ``insert``/``update``/``delete`` of one)."""
    tables = "|".join(sorted(STORE_TABLES))
    models = "|".join(sorted(STORE_MODELS))
    sql = re.compile(rf"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(?:{tables})\b", re.I)
    orm = re.compile(rf"(?:\.add\(\s*|\b(?:insert|update|delete)\(\s*)(?:{models})\b")
    store = PROJECT_ROOT / "tasks" / "jobs" / "store"
    found = []
    for root in ("tasks", "web", "keel"):
        for path in sorted((PROJECT_ROOT / root).rglob("*.py")):
            if path.is_relative_to(store):
                continue
            text = path.read_text()
            for match in [*sql.finditer(text), *orm.finditer(text)]:
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(PROJECT_ROOT)}:{line}: {match.group(0)}")
    return found


def test_only_the_store_writes_the_tables_it_owns():
    assert writes_outside_the_store() == []


def test_the_store_tables_are_the_job_layers_models():
    from tasks.jobs.model import models

    tables = {
        value.__tablename__: name
        for name, value in vars(models).items()
        if isinstance(value, type) and hasattr(value, "__tablename__")
    }
    assert set(tables) - {"job_schedulers"} == STORE_TABLES
    assert {tables[t] for t in STORE_TABLES} == STORE_MODELS
