"""A module of the user's called ``tasks`` that would hide Keel's package is named, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from keel.shadowing import shadowing_tasks_module
from tests.support.stack import PROJECT_ROOT

KEEL = str(Path(sys.executable).with_name("keel"))


def test_keels_own_tasks_package_is_not_reported():
    assert shadowing_tasks_module() is None
    assert shadowing_tasks_module(PROJECT_ROOT) is None


def test_a_tasks_module_first_on_the_path_is_named(tmp_path):
    (tmp_path / "tasks.py").write_text("def add(x, y):\n    return x + y\n")
    message = shadowing_tasks_module(tmp_path)
    assert message is not None
    assert str(tmp_path / "tasks.py") in message
    assert "hides Keel's own 'tasks' package" in message


def test_keel_up_in_a_directory_with_its_own_tasks_module_says_why_in_one_line(tmp_path):
    (tmp_path / "tasks.py").write_text("def add(x, y):\n    return x + y\n")
    env = {**os.environ, "KEEL_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [KEEL, "up"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "hides Keel's own 'tasks' package" in lines[0]


def test_pythonpath_with_a_tasks_module_stops_every_command_with_one_line(tmp_path):
    (tmp_path / "tasks.py").write_text("x = 1\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([KEEL, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "hides Keel's own 'tasks' package" in done.stderr
