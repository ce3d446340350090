"""The embedded Postgres in a private folder: reached without changing any folder's mode.

As root, Postgres runs in a user namespace (or, where those are refused, as the
``pgserver`` account); either way a checkout or home inside a 0700 folder (``/root``,
``mktemp -d``) must work, and no folder Keel did not make may change its mode.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from keel.embedded.postgres_server import ServerLaunch, closed_folder
from keel.errors import StartRefused
from tests.support.stack import PROJECT_ROOT


def test_the_closed_folder_is_the_outermost_one_its_user_may_not_search(tmp_path):
    outer = tmp_path / "outer"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    outer.chmod(0o700)
    inner.chmod(0o700)
    stranger = os.getuid() + 12345
    # (pytest's own temporary folder may be private already: then it is the outermost)
    above = closed_folder(tmp_path, stranger, stranger)
    assert closed_folder(inner / "pg", stranger, stranger) == (above or outer)
    assert closed_folder(inner / "pg", os.getuid(), os.getgid()) is None
    outer.chmod(0o701)
    assert closed_folder(inner / "pg", stranger, stranger) == (above or inner)
    outer.chmod(0o750)  # the group may search: a member of it is let through
    group = outer.stat().st_gid
    assert closed_folder(outer / "x", stranger, group) == closed_folder(tmp_path, stranger, group)


def test_an_account_that_cannot_reach_the_data_is_refused_in_one_line(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    stranger = os.getuid() + 12345
    closed = closed_folder(tmp_path, stranger, stranger) or private
    launch = ServerLaunch(who="as the test account", uid=stranger, gid=stranger)
    with pytest.raises(StartRefused) as refused:
        launch.refuse_unreachable(private / "home" / "pg", "data folder")
    message = str(refused.value)
    assert "\n" not in message
    assert f"cannot enter {closed} (mode 0700" in message and "KEEL_DATABASE_URL" in message


# Starts a cluster in the home given, with whichever pgserver comes first on sys.path, and
# says which programs it ran and what the cluster answered.
START_CLUSTER = """
import json
import sys
from pathlib import Path

import psycopg
from pgserver import _commands

from keel.embedded import EmbeddedPostgres

postgres = EmbeddedPostgres(Path(sys.argv[1]))
try:
    url = postgres.start()
    with psycopg.connect(url) as connection:
        answered = connection.execute("select 1").fetchone()
finally:
    postgres.stop()
print(json.dumps({"programs": str(_commands.POSTGRES_BIN_PATH), "answered": list(answered)}))
"""


def folder_modes(folders: list[Path]) -> dict[Path, tuple[int, int, int]]:
    return {
        folder: (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
        for folder in folders
        for info in [folder.stat()]
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="Postgres's account switch happens as root only")
def test_as_root_a_cluster_in_a_private_folder_starts_and_no_mode_changes(tmp_path):
    # Given Postgres's programs (pgserver, as a checkout's venv holds it) and a home, both
    # inside a folder only root may enter
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    packages = private / "site-packages"
    installed = Path(find_spec("pgserver").origin).parent
    shutil.copytree(installed, packages / "pgserver", symlinks=True)
    if (libs := installed.with_name("pgserver.libs")).is_dir():
        shutil.copytree(libs, packages / "pgserver.libs", symlinks=True)
    programs = packages / "pgserver" / "pginstall" / "bin"
    watched = [programs, *programs.parents]
    before = folder_modes(watched)
    # When a program whose pgserver is that copy starts the embedded Postgres there
    paths = [str(packages), *filter(None, [os.environ.get("PYTHONPATH")])]
    started = subprocess.run(
        [sys.executable, "-c", START_CLUSTER, str(private / "home")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Then it ran the copy's programs, the cluster answered, and not one folder on the way
    # to the programs or the data changed its mode or owner
    assert started.returncode == 0, started.stderr[-3000:]
    shown = json.loads(started.stdout.splitlines()[-1])
    assert shown == {"programs": str(programs), "answered": [1]}, started.stdout
    assert folder_modes(watched) == before
    assert (private / "home" / "pg" / "PG_VERSION").is_file()


def test_a_launch_without_switching_adds_nothing_around_the_program():
    assert ServerLaunch().argv(Path("/bin/postgres"), "-D", "x") == ["/bin/postgres", "-D", "x"]
    assert ServerLaunch().popen_kwargs() == {}
