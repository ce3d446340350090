"""``keel`` misused: each mistake is one line on stderr, a non-zero exit, no traceback.

Real ``keel`` processes, as a user runs them: nothing of Keel's in the environment
but what each case sets, in a folder of its own, with a registry of running stacks
of its own (``XDG_RUNTIME_DIR``) so that no stack running on this machine is found.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from keel.embedded import free_port
from tasks.jobs.schedule import schedulers
from tasks.jobs.schedule.schedulers import Scope
from tests.support.client import unique
from tests.support.keel_up import KEEL

SECRET = "a-secret-key-of-at-least-32-bytes-0123456789"
DEAD = {
    "KEEL_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
    "KEEL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
}


def keel(*args: str, cwd: Path, keep_servers: bool = False, **extra: str):
    """``keel ARGS`` in ``cwd``; the suite's servers only when ``keep_servers``."""
    kept = ("KEEL_DATABASE_URL", "KEEL_REDIS_URL", "KEEL_SECRET_KEY") if keep_servers else ()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_") or k in kept}
    env.update(XDG_RUNTIME_DIR=str(cwd / "runtime"), **extra)
    return subprocess.run(
        [KEEL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


MISUSES = {
    "no configuration, jobs list": (("jobs", "list"), {}, "KEEL_DATABASE_URL is not set"),
    "no configuration, db upgrade": (("db", "upgrade"), {}, "KEEL_DATABASE_URL is not set"),
    "no configuration, token": (
        ("token", "--tenant", "acme", "--user", "alice"),
        {},
        "KEEL_SECRET_KEY is not set",
    ),
    "malformed KEEL_QUEUE_LIMITS": (
        ("jobs", "list"),
        {"KEEL_QUEUE_LIMITS": "{reports: 2", **DEAD},
        "KEEL_QUEUE_LIMITS",
    ),
    "malformed KEEL_WEB_PORT": (("url",), {"KEEL_WEB_PORT": "eighty"}, "KEEL_WEB_PORT"),
    "unknown role": (
        ("token", "--tenant", "acme", "--user", "alice", "--role", "admin"),
        {"KEEL_SECRET_KEY": SECRET},
        "'admin' is not 'operator'",
    ),
    "unknown option": (("--bogus",), {}, "No such option"),
    "unreachable Postgres": (("jobs", "list"), DEAD, "cannot reach Postgres"),
    "unreachable Redis": (("deadletters", "list"), DEAD, "cannot reach Redis"),
}


@pytest.mark.parametrize("case", sorted(MISUSES))
def test_a_misuse_is_one_line_and_a_failure(case, tmp_path):
    args, env, said = MISUSES[case]
    result = keel(*args, cwd=tmp_path, **env)
    assert result.returncode != 0, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert said in lines[0] and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_tenant_scheduler_removed_without_tenant_names_the_option(stack, tmp_path):
    # Given a scheduler that belongs to a tenant
    scheduler_id = unique("tick")
    made = keel(
        *("schedulers", "upsert", scheduler_id, "--tenant", "acme", "--user", "alice"),
        *("--every", "60000", "--name", "report.generate"),
        *("--data", '{"reportId": "q3", "rows": 10}'),
        cwd=tmp_path,
        keep_servers=True,
    )
    assert made.returncode == 0, made.stderr
    try:
        # When it is removed without --tenant
        result = keel("schedulers", "remove", scheduler_id, cwd=tmp_path, keep_servers=True)
    finally:
        schedulers.remove(Scope("acme"), scheduler_id)
    # Then one line says there is none in the system scope, and which option finds it
    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"no scheduler {scheduler_id!r} in the system scope" in line
    assert "add --tenant acme" in line


def test_a_command_that_succeeds_prints_no_log_lines(stack, tmp_path):
    # Given the suite's servers, and stderr not a terminal (JSON logs would be chosen)
    base = {"KEEL_LOG_FORMAT": "json"}
    # When a queue is paused and resumed
    paused = keel("queues", "pause", "reports", cwd=tmp_path, keep_servers=True, **base)
    resumed = keel("queues", "resume", "reports", cwd=tmp_path, keep_servers=True, **base)
    # Then each says what it did on stdout, and nothing on stderr
    assert paused.returncode == 0 and resumed.returncode == 0, paused.stderr + resumed.stderr
    assert paused.stdout.startswith("queue reports paused") and paused.stderr == ""
    assert resumed.stdout.startswith("queue reports resumed") and resumed.stderr == ""


def test_upgrading_a_database_at_head_says_one_line_and_logs_nothing(stack, tmp_path):
    # Given the suite's database, migrated to head
    # When `keel db upgrade` runs again, stderr not a terminal
    result = keel("db", "upgrade", cwd=tmp_path, keep_servers=True)
    # Then one line says where the database is, and Alembic's INFO lines are not shown
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["database at head"], result.stdout
    assert result.stderr == ""
