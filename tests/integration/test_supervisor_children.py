"""``keel.supervisor`` with real child processes: restarts, giving up, prefixed output.

Tiny Python children stand in for the stack's commands; the behaviour under
test is the supervisor's, which does not care what the child runs.
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pytest

from keel.supervisor import Child, Output, RestartPolicy, Supervisor

pytestmark = pytest.mark.stack  # starts processes of its own


def child(name: str, code: str) -> Child:
    return Child(name, [sys.executable, "-c", code])


def supervised(*children: Child, delays: tuple[float, ...] = (0.05, 0.05)) -> tuple:
    stream = io.BytesIO()
    supervisor = Supervisor(Output(stream))
    for each in children:
        supervisor.add(each, lambda each=each: each.start(supervisor.output))
        supervisor.watched[-1].policy = RestartPolicy(delays_s=delays)
    return supervisor, stream


def test_a_child_that_keeps_dying_makes_the_stack_give_up_loudly():
    # Given a child that exits at once, every time
    supervisor, stream = supervised(child("crasher", "import sys; sys.exit(3)"))
    # When the supervisor watches it
    started = time.monotonic()
    code = supervisor.watch(stopping=lambda: time.monotonic() - started > 20, tick=lambda: None)
    # Then it was restarted as often as the policy allows, then the supervisor gave up with 1
    supervisor.stop_all(timeout_s=5)
    log = stream.getvalue().decode()
    assert code == 1
    assert log.count("crasher exited with code 3") == 3
    assert log.count("crasher restarted") == 2
    assert "giving up" in log


def test_a_child_that_dies_once_is_restarted_and_its_output_is_prefixed(tmp_path: Path):
    # Given a child that crashes on its first run only, and a quiet neighbour
    marker = tmp_path / "ran-once"
    flaky = child(
        "flaky",
        f"import pathlib, sys, time\np = pathlib.Path({str(marker)!r})\n"
        "print('run', p.exists(), flush=True)\n"
        "if not p.exists():\n    p.touch(); sys.exit(9)\n"
        "time.sleep(60)",
    )
    quiet = child("quiet", "import time; print('hello', flush=True); time.sleep(60)")
    supervisor, stream = supervised(flaky, quiet)
    # When the supervisor watches them for a moment
    started = time.monotonic()
    code = supervisor.watch(stopping=lambda: time.monotonic() - started > 2, tick=lambda: None)
    supervisor.stop_all(timeout_s=5)
    # Then the flaky one ran twice, the stack did not stop, and every line names its child
    log = stream.getvalue().decode()
    assert code == 0
    assert "flaky   | run False" in log and "flaky   | run True" in log
    assert "quiet   | hello" in log
    assert "keel    | flaky exited with code 9" in log and "keel    | flaky restarted" in log
    assert flaky.poll() is not None and quiet.poll() is not None  # stop_all stopped both
