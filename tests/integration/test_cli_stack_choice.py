"""Which stack a ``keel`` command uses, run from a folder that is not the repository.

Real ``keel`` processes; a "running stack" here is a home whose lock is held,
as ``keel up`` holds it (``keel.home.HomeLock``, a kernel ``flock``), taken
by this test process. Each test has its own registry (``XDG_RUNTIME_DIR``),
so stacks other people run on this machine are never seen.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from keel import stacks
from keel.embedded import free_port
from keel.home import HomeLock
from tasks.platform.config import write_env_file
from tests.support.keel_up import KEEL

SECRET = "a-secret-key-of-at-least-32-bytes-0123456789"


@pytest.fixture
def runtime(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "runtime"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def keel(*args: str, cwd: Path, runtime: Path, **extra: str) -> subprocess.CompletedProcess:
    """``keel ARGS`` as a user runs it in ``cwd``: nothing of Keel's in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(XDG_RUNTIME_DIR=str(runtime), **extra)
    return subprocess.run(
        [KEEL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def running_home(folder: Path, **values: str) -> tuple[Path, HomeLock]:
    """A home with an env file, registered and locked as a running ``keel up`` leaves it."""
    home = folder / ".keel"
    lock = HomeLock(home).acquire()
    write_env_file(home / "env", {"KEEL_SECRET_KEY": SECRET, **values})
    stacks.register(home)
    return home, lock


def dead_urls() -> dict[str, str]:
    return {
        "KEEL_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
        "KEEL_REDIS_URL": f"redis://:hunter2-password@127.0.0.1:{free_port()}/0",
    }


def test_a_command_in_another_folder_uses_the_one_running_stack_and_says_so(tmp_path, runtime):
    # Given one running stack in a folder, and a terminal in another folder
    home, lock = running_home(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        # When a token is asked for there
        found = keel("token", "--tenant", "acme", "--user", "alice", cwd=elsewhere, runtime=runtime)
    finally:
        lock.release()
    # Then it is signed with that stack's secret; stderr names the stack, stdout is the token
    assert found.returncode == 0, found.stderr
    assert found.stdout.count(".") == 2 and len(found.stdout.split()) == 1
    assert f"keel: using stack at {home} (keel up pid {os.getpid()})" in found.stderr


def test_a_running_stack_is_found_over_a_stale_local_env(tmp_path, runtime):
    # Given a folder whose ./.keel was left by a stopped stack, and a stack running elsewhere
    home, lock = running_home(tmp_path / "project")
    stale = tmp_path / "old"
    write_env_file(stale / ".keel" / "env", {"KEEL_SECRET_KEY": "x" * 40, **dead_urls()})
    try:
        found = keel("token", "--tenant", "acme", "--user", "bob", cwd=stale, runtime=runtime)
    finally:
        lock.release()
    # Then the running stack is used, and named
    assert found.returncode == 0, found.stderr
    assert f"using stack at {home}" in found.stderr


def test_several_running_stacks_are_listed_and_none_is_guessed(tmp_path, runtime):
    first, first_lock = running_home(tmp_path / "one")
    second, second_lock = running_home(tmp_path / "two")
    try:
        found = keel("token", "--tenant", "acme", "--user", "alice", cwd=tmp_path, runtime=runtime)
    finally:
        first_lock.release()
        second_lock.release()
    assert found.returncode == 1 and found.stdout == ""
    assert "2 stacks are running" in found.stderr and "set KEEL_HOME" in found.stderr
    assert str(first) in found.stderr and str(second) in found.stderr


def test_a_stopped_stack_is_not_found_and_the_error_says_how_to_start_one(tmp_path, runtime):
    # Given a registered home whose keel up stopped (its lock is free)
    home, lock = running_home(tmp_path / "project")
    lock.release()
    found = keel("token", "--tenant", "acme", "--user", "alice", cwd=tmp_path, runtime=runtime)
    assert found.returncode == 1, found.stdout
    assert "KEEL_SECRET_KEY is not set and no stack is running" in found.stderr
    assert "start one with `keel up`" in found.stderr and "KEEL_HOME" in found.stderr
    assert str(home) not in found.stderr


def test_a_stale_env_is_named_with_the_dead_server_it_points_at(tmp_path, runtime):
    # Given KEEL_HOME pointing at a home a stopped stack left, its URLs dead
    stale = tmp_path / "old" / ".keel"
    write_env_file(stale / "env", {"KEEL_SECRET_KEY": SECRET, **dead_urls()})
    # When jobs are listed (Postgres) and dead letters read (Redis)
    listed = keel("jobs", "list", cwd=tmp_path, runtime=runtime, KEEL_HOME=str(stale))
    letters = keel("deadletters", "list", cwd=tmp_path, runtime=runtime, KEEL_HOME=str(stale))
    # Then each says the stack is not running, which server failed and which file named it
    for result, server, variable in (
        (listed, "Postgres", "KEEL_DATABASE_URL"),
        (letters, "Redis", "KEEL_REDIS_URL"),
    ):
        assert result.returncode == 1, result.stdout
        assert f"no `keel up` is running on {stale}" in result.stderr
        assert f"cannot reach {server} at" in result.stderr
        assert f"({variable} from {stale / 'env'})" in result.stderr
        assert "Traceback" not in result.stderr
    # And the Redis password is not printed
    assert "hunter2-password" not in listed.stderr + letters.stderr


def test_the_registry_is_private_to_its_user(tmp_path, runtime):
    home, lock = running_home(tmp_path / "project")
    lock.release()
    [entry] = list(stacks.registry_dir().iterdir())
    assert stat.S_IMODE(stacks.registry_dir().stat().st_mode) == 0o700
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert entry.read_text().strip() == str(home)


def test_a_program_of_yours_in_another_folder_finds_the_stack_as_keel_does(tmp_path, runtime):
    # Given one running stack, and a script of the user's in an unrelated folder
    home, lock = running_home(tmp_path / "project", KEEL_WEB_URL="http://127.0.0.1:18123")
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    script = (
        "from tasks.platform.config import get_settings; s = get_settings(); "
        "print(s.home, s.web_url)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        found = subprocess.run(
            [sys.executable, "-c", script],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        lock.release()
    # Then it reads that stack's settings, and says once which stack it uses
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [str(home), "http://127.0.0.1:18123"]
    assert found.stderr.count(f"keel: using stack at {home}") == 1, found.stderr


def test_a_found_stack_is_read_but_changed_only_when_named(tmp_path, runtime):
    # Given one stack running in a project, and a terminal in an unrelated folder
    home, lock = running_home(tmp_path / "project", **dead_urls())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        # When a command that changes the stack runs there
        paused = keel("queues", "pause", "reports", cwd=elsewhere, runtime=runtime)
        # And the same with the stack named
        named = keel(
            "--home", str(home), "queues", "pause", "reports", cwd=elsewhere, runtime=runtime
        )
    finally:
        lock.release()
    # Then the first is refused in one line that says how to name it; nothing was attempted
    assert paused.returncode == 1 and paused.stdout == ""
    [line] = paused.stderr.strip().splitlines()[-1:]
    assert f"keel --home {home} queues pause reports" in line, paused.stderr
    assert "cannot reach" not in paused.stderr
    # And the named one went ahead (to this fake stack's dead servers, in one line)
    assert named.returncode == 1 and "cannot reach" in named.stderr, named.stderr
    assert "found running outside this folder" not in named.stderr


def test_keel_url_with_no_stack_running_says_nothing_answers(tmp_path, runtime):
    # Given a folder with no stack, and none running
    found = keel("url", "api", cwd=tmp_path, runtime=runtime)
    # Then the address a stack would have is printed, and stderr says none answers there yet
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "http://127.0.0.1:8000/api/v1"
    assert "no `keel up` is running" in found.stderr


def test_keel_env_points_a_shell_at_the_running_stack_without_secrets(tmp_path, runtime):
    home, lock = running_home(tmp_path / "project", KEEL_WEB_URL="http://127.0.0.1:18124")
    try:
        found = keel("env", cwd=tmp_path, runtime=runtime)
    finally:
        lock.release()
    assert found.returncode == 0, found.stderr
    assert f"export KEEL_HOME={home}" in found.stdout.splitlines()
    assert "export KEEL_WEB_URL=http://127.0.0.1:18124" in found.stdout.splitlines()
    assert SECRET not in found.stdout and "SECRET" not in found.stdout
