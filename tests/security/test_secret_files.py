"""Every file ``keel up`` writes under its home is private from the moment it exists, and
no folder of the user's changes its mode or owner.

A file written with the process umask and ``chmod``-ed afterwards is readable
by others in between; a file created with the umask's help only is readable
by others under a laxer umask. So the test runs a real ``keel up`` under
``strace -f`` with umask 022 and reads every file creation of the supervisor
(where the env file, the secret, the Redis config and the stack registry are
written): each must ask for no group or other bits itself, and nothing may be
``chmod``-ed afterwards. Its children are traced too (Postgres, Redis, the
workers, the web app): none of them may change the mode or owner of anything
outside the home and the stack registry that Keel made, and ``stat`` of every
folder above the home and the checkout reads the same after the stack ran.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from importlib.util import find_spec
from pathlib import Path

import psutil
import pytest

from tests.support.keel_up import ANNOUNCEMENT, KEEL, clean_env
from tests.support.stack import PROJECT_ROOT, wait_for

pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (.ci/run installs it)"),
]
# strace -f -y: "PID call(...)"; a descriptor is shown with its path, "3</path>", and the
# current folder too, "AT_FDCWD</cwd>"
CREATE = re.compile(
    r'^(\d+) +(openat|creat)\((?:AT_FDCWD(?:<[^>]*>)?, )?"([^"]+)", ([A-Z_|]+)(?:, (0\d+))?'
)
CHMOD = re.compile(r"^(?:\d+ +)?(chmod|fchmod|fchmodat)\(.*, (0\d+)\)")
# Every call that changes a mode or an owner, with where it points: a path, a descriptor's
# path, or a folder's descriptor and a name in it
CHANGE = re.compile(
    r"^(?P<pid>\d+) +(?P<call>chmod|fchmod|fchmodat|chown|fchown|lchown|fchownat)\("
    r'(?:(?:AT_FDCWD|\d+)<(?P<fd>[^>]*)>(?:, "(?P<name>[^"]*)")?|"(?P<path>[^"]*)")'
)
CHANGE_CALLS = "chmod,fchmod,fchmodat,chown,fchown,lchown,fchownat"


def creations(trace: str, roots: list[Path], pid: int) -> list[tuple[str, str, int]]:
    """The files process ``pid`` created under ``roots``: (path, flags, mode asked for)."""
    found = []
    for line in trace.splitlines():
        match = CREATE.match(line)
        if not match or int(match.group(1)) != pid or "O_CREAT" not in match.group(4):
            continue
        path = match.group(3)
        if any(path.startswith(str(root)) for root in roots):
            found.append((path, match.group(4), int(match.group(5) or "0666", 8)))
    return found


def changed(trace: str) -> list[tuple[str, str]]:
    """(call, path) of every mode or owner change any traced process asked for (a path
    relative to a folder strace does not show is left as it is: it counts as outside)."""
    found = []
    for line in trace.splitlines():
        match = CHANGE.match(line)
        if not match:
            continue
        if match["path"] is not None:
            path = match["path"]
        elif match["name"] is not None:
            path = os.path.join(match["fd"], match["name"])
        else:
            path = match["fd"]
        found.append((match["call"], path))
    return found


def folder_stats(folders: list[Path]) -> dict[Path, tuple[int, int, int]]:
    return {
        folder: (folder.stat().st_mode, folder.stat().st_uid, folder.stat().st_gid)
        for folder in folders
    }


def users_folders(home: Path) -> list[Path]:
    """Every folder above the home, the checkout and those on the way to Postgres's programs."""
    spec = find_spec("pgserver")
    programs = Path(spec.origin).parent / "pginstall" / "bin" if spec and spec.origin else None
    ends = [home.parent, PROJECT_ROOT, *([programs] if programs else [])]
    return sorted({folder for end in ends for folder in (end, *end.parents)})


def test_no_file_of_the_stack_is_ever_readable_by_others(tmp_path):
    home = tmp_path / "home"
    env = clean_env(home)
    runtime = Path(env["XDG_RUNTIME_DIR"])
    assert not home.exists() and not runtime.exists()  # both are Keel's to make
    folders = users_folders(home)
    before = folder_stats(folders)
    trace_path, log_path = tmp_path / "trace", tmp_path / "up.log"
    calls = f"trace=openat,creat,{CHANGE_CALLS}"
    strace = ["strace", "-f", "--seccomp-bpf", "-y", "-qq", "-e", calls, "-o", str(trace_path)]
    with log_path.open("wb") as log:
        tracer = subprocess.Popen(
            [*strace, KEEL, "up"],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.umask(0o022),
        )
    supervisor = None
    try:
        wait_for(lambda: ANNOUNCEMENT in log_path.read_bytes(), timeout=240, interval=0.5)
        assert tracer.poll() is None, log_path.read_text()
    finally:
        for child in psutil.Process(tracer.pid).children():
            supervisor = child.pid
            child.send_signal(signal.SIGINT)  # keel up itself: a clean stop
        tracer.wait(timeout=120)
    trace = trace_path.read_text()
    assert supervisor is not None
    made = creations(trace, [home, runtime], supervisor)
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
    # No process of the stack changed the mode or owner of anything Keel did not make
    # (the trace saw the children: Postgres's own data folder is made 0700 by initdb)
    changes = changed(trace)
    assert any(path.startswith(f"{home}/pg") for _, path in changes), changes[:20]
    outside = [
        (call, path)
        for call, path in changes
        if not any(path == str(root) or path.startswith(f"{root}/") for root in (home, runtime))
    ]
    assert outside == [], outside[:20]
    # And each folder above the home and the checkout reads as it did: mode, owner, group
    assert folder_stats(folders) == before
