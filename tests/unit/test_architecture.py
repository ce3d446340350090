"""Keel's architecture holds across the whole tree: layers, no cycles, nothing flat.

``lint-imports`` checks the contracts in ``pyproject.toml`` (``[tool.importlinter]``):
infrastructure (``tasks.platform``), the job layer, the seed apps, the app's assembly,
``web`` and ``keel`` import only downwards; the packages of ``tasks/jobs/`` are layered
too; no two modules of a package import each other in a cycle; nothing above the job
layer reaches into its store; the generic layer does not import the seed apps; the
provider sandbox imports nothing of Keel. A copy of the tree with one wrong import
added shows the contracts catch it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.stack import PROJECT_ROOT

JOBS = PROJECT_ROOT / "tasks" / "jobs"
TREE_LAYERS = "The whole tree is layered: platform, job layer, apps, assembly, web, keel"
JOB_LAYERS = "The job layer's packages import only from the layers below them"
NO_STORE = "Above the job layer, nothing reaches into its store"
# The packages the contracts cover that are not a folder of the repository's top
PACKAGE_FOLDERS = {"provider_sandbox": PROJECT_ROOT / "sandbox" / "provider_sandbox"}


def contracts() -> list[dict]:
    config = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    found: list[dict] = config["tool"]["importlinter"]["contracts"]
    return found


def contract(name: str) -> dict:
    [found] = [c for c in contracts() if c["name"] == name]
    return found


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the tree at ``root`` (its packages first on the import path)."""
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(lint), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=180
    )


def test_the_import_contracts_hold():
    done = lint_imports(PROJECT_ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-2000:]


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages the contracts cover, and pyproject.toml, copied (no tests, no venv)."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copy(PROJECT_ROOT / "pyproject.toml", root)
    packages = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in packages["root_packages"]:
        shutil.copytree(
            PACKAGE_FOLDERS.get(package, PROJECT_ROOT / package),
            root / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return root


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("web/queues.py", "from tasks.jobs.store import jobs", NO_STORE),
        ("keel/cli.py", "from tasks.jobs.store.listing import JobFilter", NO_STORE),
        ("tasks/platform/db.py", "from tasks.jobs.model import registry", TREE_LAYERS),
        ("tasks/jobs/intake/enqueue.py", "from tasks.celery import app", TREE_LAYERS),
        ("tasks/reports/jobs.py", "from web import tokens", TREE_LAYERS),
        ("tasks/jobs/model/options.py", "from tasks.jobs.store import jobs", JOB_LAYERS),
    ],
    ids=["web-store", "cli-store", "platform-jobs", "jobs-assembly", "app-web", "model-store"],
)
def test_a_wrong_import_breaks_a_contract(tree_copy: Path, module: str, line: str, broken: str):
    path = tree_copy / module
    kept = path.read_text()
    try:
        path.write_text(f"{kept}\n{line}  # noqa\n")
        done = lint_imports(tree_copy)
    finally:
        path.write_text(kept)
    assert done.returncode != 0, done.stdout[-2000:]
    assert f"{broken} BROKEN" in done.stdout, done.stdout[-3000:]


def test_every_top_level_part_of_tasks_is_in_the_whole_tree_layers():
    named = {
        part.strip()
        for layer in contract(TREE_LAYERS)["layers"]
        for part in layer.split("|")
        if part.strip().startswith("tasks.")
    }
    parts = {
        f"tasks.{p.stem}"
        for p in (PROJECT_ROOT / "tasks").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    }
    assert parts == named, f"not layered: {sorted(parts - named)}; gone: {sorted(named - parts)}"


def test_every_package_of_the_job_layer_is_a_layer_and_nothing_lies_flat():
    packages = {p.name for p in JOBS.iterdir() if (p / "__init__.py").exists()}
    layers = {name.removeprefix("tasks.jobs.") for name in contract(JOB_LAYERS)["layers"]}
    assert packages == layers, (packages, layers)
    flat = sorted(p.name for p in JOBS.glob("*.py") if p.name != "__init__.py")
    assert flat == [], f"modules at tasks/jobs/'s top level belong in a layer: {flat}"


def test_the_init_docstring_lists_the_layers_in_their_order():
    import tasks.jobs

    doc = tasks.jobs.__doc__ or ""
    named = [name.removeprefix("tasks.jobs.") + "/" for name in contract(JOB_LAYERS)["layers"]]
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
    "job_stats",
    "queue_pauses",
    "job_logs",
    "job_waits",
    "held_jobs",
    "bulk_actions",
    "idempotency_keys",
    "queue_limits",
    "queue_limit_changes",
    "webhook_endpoints",
    "key_limit_overrides",
    "key_limit_changes",
    "platform_views",
}
STORE_MODELS = {
    "JobRecord",
    "DedupClaim",
    "RetryAudit",
    "JobAction",
    "ArchivedJob",
    "JobCount",
    "JobCountDelta",
    "JobStat",
    "QueuePause",
    "JobLogLine",
    "JobWait",
    "HeldJob",
    "BulkAction",
    "IdempotencyKey",
    "QueueLimitOverride",
    "QueueLimitChange",
    "WebhookEndpoint",
    "KeyLimitOverride",
    "KeyLimitChange",
    "PlatformView",
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
