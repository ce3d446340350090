"""Which stack a ``keel`` command talks to, from whatever folder it runs in.

``keel up`` registers its home for the current user (one small private file
per home under ``$XDG_RUNTIME_DIR/keel/stacks``, else
``~/.local/state/keel/stacks``) and removes it when it stops. A command then
uses, in order:

1. ``$KEEL_HOME`` when it is set (the user said so);
2. ``./.keel`` when a ``keel up`` is running on it;
3. the one running stack of this user, found through the registry; several
   running is an error listing them (set ``KEEL_HOME`` to choose);
4. ``./.keel`` as it is, with nothing running.

"Running" is asked of the kernel (``keel.home.running_owner``): a registered
or leftover home whose ``keel up`` has stopped is never picked, and an env
file a stopped stack left behind is used only with a warning saying so,
since its embedded servers stopped with it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from keel.embedded.private import private_dir, write_private
from keel.home import running_owner
from tasks.config import ENV_FILE_NAME, keel_home
from tasks.jobs.model.errors import KeelError


class SeveralStacks(KeelError):
    """More than one stack of this user is running, and nothing says which one to use."""

    code = "several_stacks"


@dataclass(frozen=True)
class Choice:
    """The home a command uses, how it was chosen, and who runs it (``pid`` None: nobody)."""

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


def registry_dir() -> Path:
    """This user's registry of running homes (private to the user)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "keel" / "stacks"
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "keel" / "stacks"


def _entry(home: Path) -> Path:
    return registry_dir() / hashlib.sha256(str(home).encode()).hexdigest()[:24]


def register(home: Path) -> None:
    """Record ``home`` as this user's (``keel up``, once it holds the home's lock)."""
    try:
        private_dir(registry_dir())
        write_private(_entry(home), f"{home}\n")
    except OSError as exc:  # the stack runs all the same; other folders need KEEL_HOME
        print(f"keel: this stack is not registered in {registry_dir()}: {exc}", file=sys.stderr)


def unregister(home: Path) -> None:
    _entry(home).unlink(missing_ok=True)


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
    """The home this command should use (see the module's docstring); ``SeveralStacks``."""
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
