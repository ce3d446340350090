"""A failed run keeps its logs where the next reader finds them (``tests.support.kept_logs``).

An inner pytest, with the suite's own conftest, stands in for a tier: its test
writes what the servers write into the session's ``KEEL_HOME`` and fails (or
passes), and the outer test reads what ``KEEL_TEST_LOG_DIR`` holds afterwards.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import kept_logs
from tests.support.stack import PROJECT_ROOT

INNER_TEST = """
import logging
import os
from pathlib import Path


def test_the_servers_log_and_the_test_fails_or_passes():
    home = Path(os.environ["KEEL_HOME"])
    (home / "worker-inner.log").write_text("the worker said this\\n")
    (home / "pg").mkdir(exist_ok=True)
    (home / "pg" / "log").write_text("postgres said that\\n")
    (home / "pg" / "PG_VERSION").write_text("16\\n")
    logging.getLogger("inner").warning("a record of the test process")
    assert os.environ["INNER_OUTCOME"] == "pass"


def test_another_one_for_the_other_worker():
    pass
"""


def inner_pytest(tmp_path: Path, outcome: str, *args: str) -> subprocess.CompletedProcess:
    """Run the inner test file with the suite's conftest and ``KEEL_TEST_LOG_DIR`` set."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update({kept_logs.ENV: str(tmp_path / "logs"), "INNER_OUTCOME": outcome})
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # seconds per process; xdist is named below
    command = [sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-p", "tests.conftest"]
    command += ["-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"), "-m", "not slow"]
    command += ["--basetemp", str(tmp_path / "basetemp"), *args]
    return subprocess.run(
        [*command, str(tmp_path / "test_inner.py")],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_failed_tier_keeps_its_output_and_its_servers_logs(tmp_path):
    # When a tier run two processes at a time fails
    run = inner_pytest(tmp_path, "fail", "-n", "2")
    assert run.returncode == 1, run.stdout + run.stderr
    # Then its folder, named after its -m expression, holds its JUnit XML,
    tier = tmp_path / "logs" / "not-slow"
    assert "test_the_servers_log_and_the_test_fails_or_passes" in (tier / "junit.xml").read_text()
    # and the logs of the worker process that ran the test: the servers' (not their data)
    [process] = [p for p in tier.glob("gw*") if (p / "home" / "worker-inner.log").exists()]
    assert (process / "home" / "worker-inner.log").read_text() == "the worker said this\n"
    assert (process / "home" / "pg" / "log").read_text() == "postgres said that\n"
    assert not (process / "home" / "pg" / "PG_VERSION").exists()
    assert "a record of the test process" in (process / "pytest.log").read_text()
    # And the run says where, at its end
    assert run.stdout.splitlines()[-1].endswith(f" logs of this run kept in {tier}/ -"), run.stdout


def test_a_tier_that_passed_leaves_nothing(tmp_path):
    run = inner_pytest(tmp_path, "pass")
    assert run.returncode == 0, run.stdout + run.stderr
    assert list((tmp_path / "logs").iterdir()) == []
    assert "logs of this run kept" not in run.stdout


def test_only_logs_are_copied_privately_and_a_long_one_from_its_end(tmp_path, monkeypatch):
    source = tmp_path / "home"
    (source / "redis").mkdir(parents=True)
    (source / "redis" / "redis.log").write_text("ready\n")
    (source / "redis" / "dump.rdb").write_text("data")
    (source / "web-1.log").write_text("0123456789")
    (source / "skipped").mkdir()
    (source / "skipped" / "x.log").write_text("not entered")
    monkeypatch.setattr(kept_logs, "MAX_BYTES", 4)

    copied = kept_logs.copy_logs(source, tmp_path / "kept", skip=("skip",))

    kept = tmp_path / "kept"
    assert copied == 2
    assert (kept / "redis" / "redis.log").read_text() == "[first 2 bytes left out]\nady\n"
    assert (kept / "web-1.log").read_text() == "[first 6 bytes left out]\n6789"
    assert not (kept / "redis" / "dump.rdb").exists()
    assert not (kept / "skipped").exists()
    mode = stat.S_IMODE((kept / "web-1.log").stat().st_mode)
    assert mode == 0o600


def test_ci_runs_the_readme_test_command_unchanged_and_keeps_a_failed_run(tmp_path):
    readme = (PROJECT_ROOT / "README.md").read_text().splitlines()
    [command] = [line for line in readme if line.startswith("python3 -m venv") and "mypy" in line]
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    assert f"{{ {command}; }} 2>&1 | tee" in ci, command
    assert f"export {kept_logs.ENV}=" in ci


@pytest.mark.parametrize(
    ("markexpr", "name"),
    [("not stack and not slow", "not-stack-and-not-slow"), ("", "all"), ("(a or b)", "a-or-b")],
)
def test_tier_names(markexpr, name):
    assert kept_logs.tier_name(markexpr) == name
