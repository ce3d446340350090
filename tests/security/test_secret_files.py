"""Every file ``keel up`` writes under its home is private from the moment it exists.

A file written with the process umask and ``chmod``-ed afterwards is readable
by others in between; a file created with the umask's help only is readable
by others under a laxer umask. So the test runs a real ``keel up`` under
``strace`` with umask 022 and reads every file creation of the supervisor
(where the env file, the secret, the Redis config and the stack registry are
written): each must ask for no group or other bits itself, and nothing may be
``chmod``-ed afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.support.keel_up import ANNOUNCEMENT, KEEL, clean_env
from tests.support.stack import PROJECT_ROOT, wait_for

pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (.ci/run installs it)"),
]
CREATE = re.compile(r'^(?:\d+ +)?(openat|creat)\((?:AT_FDCWD, )?"([^"]+)", ([A-Z_|]+)(?:, (0\d+))?')
CHMOD = re.compile(r"^(?:\d+ +)?(chmod|fchmod|fchmodat)\(.*, (0\d+)\)")


def creations(trace: str, roots: list[Path]) -> list[tuple[str, str, int]]:
    found = []
    for line in trace.splitlines():
        match = CREATE.match(line)
        if not match or "O_CREAT" not in match.group(3):
            continue
        path = match.group(2)
        if any(path.startswith(str(root)) for root in roots):
            found.append((path, match.group(3), int(match.group(4) or "0666", 8)))
    return found


def test_no_file_of_the_stack_is_ever_readable_by_others(tmp_path):
    home = tmp_path / "home"
    env = clean_env(home)
    runtime = Path(env["XDG_RUNTIME_DIR"])
    trace_path, log_path = tmp_path / "trace", tmp_path / "up.log"
    calls = "trace=openat,creat,chmod,fchmod,fchmodat"
    with log_path.open("wb") as log:
        tracer = subprocess.Popen(
            ["strace", "-qq", "-e", calls, "-o", str(trace_path), KEEL, "up"],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.umask(0o022),
        )
    try:
        wait_for(lambda: ANNOUNCEMENT in log_path.read_bytes(), timeout=180, interval=0.5)
        assert tracer.poll() is None, log_path.read_text()
    finally:
        for child in psutil.Process(tracer.pid).children():
            child.send_signal(signal.SIGINT)  # keel up itself: a clean stop
        tracer.wait(timeout=120)
    trace = trace_path.read_text()
    made = creations(trace, [home, runtime])
    names = {Path(path).name for path, _, _ in made}
    # The secrets' files were seen being made (the trace is not empty by accident)
    assert {"secret", "lock"} <= names and any(n.endswith(".tmp") for n in names), sorted(names)
    lax = [(path, oct(mode)) for path, _, mode in made if mode & 0o077]
    assert lax == [], lax
    # Nor is anything opened to group or others later, not even a folder's search bit (as
    # root, the embedded Postgres reaches its data as root does: no folder's mode changes)
    widened = [
        line
        for line in trace.splitlines()
        if (found := CHMOD.match(line)) and int(found.group(2), 8) & 0o077
    ]
    assert widened == [], widened[:10]
