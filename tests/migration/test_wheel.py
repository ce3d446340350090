"""A built wheel ships everything Keel's source tree holds, and carries its migrations:
installed in a fresh venv, it migrates a new database.

The venv gets Keel from the wheel alone (``--no-deps``, no index) and its
dependencies from this interpreter's site-packages through a ``.pth`` line,
so the test needs no network and takes seconds. It runs from a folder
outside the checkout, so nothing can be found there by accident.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import shutil
import site
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, make_url, text

from tasks.models import metadata
from tasks.platform.config import get_settings
from tasks.platform.migrate import alembic_config
from tests.support.stack import PROJECT_ROOT

pytestmark = pytest.mark.stack  # starts processes of its own

# The folders Keel's distribution is made of (setup.py's packages), and where each installs:
# the repository's migrations/ is the package tasks.migrations.
SOURCE_ROOTS = {
    "tasks": "tasks",
    "web": "web",
    "keel": "keel",
    "provider_sandbox": "provider_sandbox",
    "migrations": "tasks/migrations",
}

# Local state that is no part of a source tree (and would slow the copy).
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".keel", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "results"
)


def run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


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
        "keel/py.typed",
    ):
        assert needed in shipped
    # and its metadata carries the licence file and says what it is
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    [metadata_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata_text = zipfile.ZipFile(wheel).read(metadata_name).decode()
    assert "Classifier: Typing :: Typed" in metadata_text
    assert "Requires-Python: >=3.11" in metadata_text


def fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    python = venv / "bin" / "python"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            wheel,
        ],
        tmp_path,
    )
    purelib = run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path
    )
    # Plain path lines: this interpreter's own .pth files (its editable Keel) are not processed.
    Path(purelib.strip(), "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


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


def test_a_built_wheel_installs_in_a_fresh_venv_and_migrates_a_new_database(stack, wheel, tmp_path):
    # The dashboard's templates and assets are in it (package data: no CDN, no build step)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("web/ui/templates/ui/base.html", "web/ui/static/ui/app.js"):
        assert needed in shipped, f"{needed} is not in the wheel"
    venv = fresh_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KEEL_REDIS_URL")}
    found = (
        "import tasks.migrations, tasks.platform.migrate; "
        "print(tasks.migrations.__file__, tasks.platform.migrate.__file__)"
    )
    where = run([venv / "bin" / "python", "-c", found], elsewhere, env)
    assert all(path.startswith(str(venv)) for path in where.split()), where
    # the migrations are Keel's, under tasks: no top-level package of that generic name
    gone = subprocess.run(
        [venv / "bin" / "python", "-c", "import migrations"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert gone.returncode != 0 and "No module named 'migrations'" in gone.stderr, gone

    name, url = scratch_database()
    try:
        env.update(KEEL_DATABASE_URL=url, KEEL_HOME=str(tmp_path / "home"))
        output = run([venv / "bin" / "keel", "db", "upgrade"], elsewhere, env)
        assert "database at head" in output
        version_line = run([venv / "bin" / "keel", "--version"], elsewhere, env)
        assert version_line.strip() == f"keel, version {wheel.name.split('-')[1]}"

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
