"""The embedded Postgres in a private folder: reached without changing any folder's mode.

As root, Postgres runs in a user namespace (or, where those are refused, as the
``pgserver`` account); either way a checkout or home inside a 0700 folder (``/root``,
``mktemp -d``) must work, and no folder Keel did not make may change its mode.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psycopg
import pytest

from keel.embedded import EmbeddedPostgres
from keel.embedded.postgres_server import ServerLaunch, closed_folder
from keel.errors import StartRefused


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


@pytest.mark.skipif(os.geteuid() != 0, reason="Postgres's account switch happens as root only")
def test_as_root_a_cluster_in_a_private_folder_starts_and_no_mode_changes(tmp_path):
    # Given a home inside a folder only root may enter
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    watched = [private, tmp_path, *tmp_path.parents]
    before = {folder: stat.S_IMODE(folder.stat().st_mode) for folder in watched}
    postgres = EmbeddedPostgres(private / "home")
    # When the embedded Postgres starts there
    try:
        url = postgres.start()
        with psycopg.connect(url) as connection:
            answered = connection.execute("select 1").fetchone()
    finally:
        postgres.stop()
    # Then it answers, and not one folder on the way changed its mode
    assert answered == (1,)
    after = {folder: stat.S_IMODE(folder.stat().st_mode) for folder in watched}
    assert after == before
    assert (private / "home" / "pg" / "PG_VERSION").is_file()


def test_a_launch_without_switching_adds_nothing_around_the_program():
    assert ServerLaunch().argv(Path("/bin/postgres"), "-D", "x") == ["/bin/postgres", "-D", "x"]
    assert ServerLaunch().popen_kwargs() == {}
