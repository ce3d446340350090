"""Which stack a process talks to, from whatever folder it runs in.

``keel up`` holds an ``flock`` on ``$KEEL_HOME/lock`` while it runs and
registers its home for the current user (one small private file per home
under ``$XDG_RUNTIME_DIR/keel/stacks``, else ``~/.local/state/keel/stacks``).
A ``keel`` command, a worker or a script of yours then uses, in order:

1. ``$KEEL_HOME`` when it is set (the user said so);
2. ``./.keel`` when a ``keel up`` is running on it;
3. the one running stack of this user, found through the registry; several
   running is an error listing them (set ``KEEL_HOME`` to choose);
4. ``./.keel`` as it is, with nothing running.

"Running" is asked of the kernel (``running_owner``): a registered or
leftover home whose ``keel up`` has stopped is never picked. This module
only reads; ``keel.stacks`` writes the registry and ``keel.home`` the lock.
"""

from __future__ import annotations

import fcntl
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tasks.platform.errors import KeelError

ENV_FILE_NAME = "env"
LOCK_FILE = "lock"


def keel_home() -> Path:
    """The folder holding embedded state (``KEEL_HOME``, default ``./.keel``)."""
    return Path(os.environ.get("KEEL_HOME", ".keel")).resolve()


class SeveralStacks(KeelError):
    """More than one stack of this user is running, and nothing says which one to use."""

    code = "several_stacks"


@dataclass(frozen=True)
class Choice:
    """The home a process uses, how it was chosen, and who runs it (``pid`` None: nobody)."""

    home: Path
    how: str  # "KEEL_HOME", "./.keel", "found" (the registry), "none"
    pid: str | None

    @property
    def stale_env(self) -> Path | None:
        """The env file of a stack that is not running, if one is there to be read."""
        path = self.home / ENV_FILE_NAME
        return path if self.pid is None and path.is_file() else None

    def describe(self) -> str:
        if self.pid is not None:
            return f"using stack at {self.home} (keel up pid {self.pid})"
        return f"using {self.home} (no `keel up` is running on it)"


def running_owner(home: Path) -> str | None:
    """The pid of the ``keel up`` running on ``home``, or ``None`` when none is.

    Asks the kernel, not the pid file: a lock nobody holds is a stack that
    stopped (or crashed), whatever the file still says. The probe takes a
    shared lock for an instant and never creates anything.
    """
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def registry_dir() -> Path:
    """This user's registry of running homes (private to the user)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "keel" / "stacks"
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "keel" / "stacks"


def running() -> list[Choice]:
    """This user's registered homes whose ``keel up`` is running now, by path."""
    folder = registry_dir()
    try:
        trusted = folder.stat().st_uid == os.getuid()
        entries = sorted(folder.iterdir()) if trusted else []
    except OSError:
        return []
    found = {}
    for entry in entries:
        try:
            home = Path(entry.read_text().strip())
        except (OSError, UnicodeDecodeError):
            continue
        pid = running_owner(home) if home.is_absolute() else None
        if pid is not None:
            found[home] = Choice(home, "found", pid)
    return [found[home] for home in sorted(found)]


def choose() -> Choice:
    """The home this process should use (see the module's docstring); ``SeveralStacks``."""
    if os.environ.get("KEEL_HOME"):
        home = keel_home()
        return Choice(home, "KEEL_HOME", running_owner(home))
    local = keel_home()
    pid = running_owner(local)
    if pid is not None:
        return Choice(local, "./.keel", pid)
    stacks = running()
    if len(stacks) == 1:
        return stacks[0]
    if len(stacks) > 1:
        listed = "; ".join(f"{s.home} (pid {s.pid})" for s in stacks)
        raise SeveralStacks(
            f"{len(stacks)} stacks are running: {listed}; "
            "set KEEL_HOME to the one to use (e.g. KEEL_HOME=" + str(stacks[0].home) + ")"
        )
    return Choice(local, "none", None)


_ANNOUNCED: set[Path] = set()


def settings_home() -> Path:
    """The home whose env file a process's settings read.

    A process with both servers' URLs in its environment (a deployed worker)
    reads ``./.keel`` or ``$KEEL_HOME`` as it always did; any other looks for
    a running stack as the ``keel`` commands do, and says on stderr, once, which
    stack it found when that was not the home it was told or started in.
    """
    if os.environ.get("KEEL_HOME") or (
        os.environ.get("KEEL_DATABASE_URL") and os.environ.get("KEEL_REDIS_URL")
    ):
        return keel_home()
    choice = choose()
    if choice.how == "found" and choice.home not in _ANNOUNCED:
        _ANNOUNCED.add(choice.home)
        print(f"keel: {choice.describe()}", file=sys.stderr)
    return choice.home
