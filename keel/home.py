"""``$KEEL_HOME`` owned by one ``keel up`` at a time.

Two supervisors on one home would run two Redis servers on one append-only
file and two worker sets on one database, and the second would rewrite
``$KEEL_HOME/env`` under the first. ``keel up`` therefore takes an exclusive
``flock`` on ``$KEEL_HOME/lock`` before it starts or writes anything, and
keeps it until it exits. The kernel drops the lock when the process dies,
however it dies, so a crash never leaves a stale lock; the pid written
inside is only there to name the owner (in the refusal, and to `keel` commands
that find the stack: `tasks.platform.stacks`).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from keel.embedded.private import private_dir
from tasks.jobs.model.errors import KeelError
from tasks.platform.stacks import LOCK_FILE

PROBE_RETRIES = 4  # ``running_owner`` takes a shared lock for an instant


class HomeBusy(KeelError):
    """Another ``keel up`` owns this home."""

    code = "home_busy"

    def __init__(self, home: Path, pid: str) -> None:
        super().__init__(
            f"another `keel up` (pid {pid or 'unknown'}) is running on {home}; "
            "stop it first, or set KEEL_HOME to another folder"
        )
        self.pid = pid


class HomeLock:
    """An exclusive, non-blocking lock on a Keel home, held until ``release``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> HomeLock:
        """Take the lock or raise ``HomeBusy`` at once, changing nothing on refusal."""
        private_dir(self.home)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        for attempt in range(PROBE_RETRIES + 1):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt < PROBE_RETRIES:  # a `keel` command's probe holds it for an instant
                    time.sleep(0.05)
                    continue
                owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                raise HomeBusy(self.home, owner) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None
