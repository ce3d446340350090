"""``keel up`` as a user runs it: the real command on a home of its own.

Starting the whole stack takes seconds, so tests share one where they can
(the session fixture ``keel_up`` in ``tests/conftest.py``) and start their
own only to kill it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from keel.embedded import free_port
from tasks.platform.config import read_env_file
from tests.support.stack import PROJECT_ROOT, wait_for

KEEL = str(Path(sys.executable).with_name("keel"))
ANNOUNCEMENT = b"Keel is up."


def clean_env(home: Path) -> dict[str, str]:
    """The caller's environment without the suite's ``KEEL_*``: nothing configured but ports.

    The stack registers in a registry of its own (``XDG_RUNTIME_DIR``), so that
    commands run "from another folder" find it and no stack of anyone else's.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        XDG_RUNTIME_DIR=str(home.parent / f"{home.name}-runtime"),
        KEEL_HOME=str(home),
        KEEL_WEB_PORT=str(free_port()),
        KEEL_FLOWER_PORT=str(free_port()),
        KEEL_SANDBOX_PORT=str(free_port()),
    )
    return env


def command_line(process: psutil.Process) -> list[str]:
    """Its arguments; none for a process that exited meanwhile (or is only a zombie)."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has exited: only its parent's bookkeeping is left)."""
    found = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


@dataclass
class KeelUp:
    """One ``keel up`` process over ``home``; ``start`` may be called again after it ended."""

    home: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    runs: int = 0
    args: tuple[str, ...] = ()  # after ``keel up``, e.g. ("--include", "examples.hello_jobs")
    cwd: Path = PROJECT_ROOT  # the folder ``keel up`` is started in

    def __post_init__(self) -> None:
        self.env = self.env or clean_env(self.home)

    @property
    def log_path(self) -> Path:
        return self.home.parent / f"{self.home.name}-up-{self.runs}.log"

    def start(self, timeout: float = 180) -> KeelUp:
        """Run ``keel up`` and wait for its announcement (it comes once ``/readyz`` is ok)."""
        self.runs += 1
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [KEEL, "up", *self.args],
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._announced, timeout=timeout, interval=0.3)
        return self

    def _announced(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log_tail()
        return ANNOUNCEMENT in self.log_path.read_bytes()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def token(self, tenant: str = "acme", user: str = "alice") -> str:
        """A user's API token from ``keel token``, as a user gets one."""
        return subprocess.run(
            [KEEL, "token", "--tenant", tenant, "--user", user],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:] if self.log_path.exists() else ""

    @property
    def stack_env(self) -> dict[str, str]:
        return read_env_file(self.home / "env")

    @property
    def web(self) -> str:
        return self.stack_env["KEEL_WEB_URL"]

    def tree(self) -> list[psutil.Process]:
        """The supervisor and every process under it, servers included."""
        assert self.process is not None
        root = psutil.Process(self.process.pid)
        return [root, *root.children(recursive=True)]

    def child(self, marker: str) -> psutil.Process:
        """The supervisor's direct child whose command line contains ``marker``."""
        assert self.process is not None
        for process in psutil.Process(self.process.pid).children():
            if marker in " ".join(process.cmdline()):
                return process
        raise AssertionError(f"no child of keel up runs {marker!r}:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> tuple[int, list]:
        """Signal the supervisor and wait; (exit code, processes it had)."""
        assert self.process is not None
        tree = self.tree() if self.process.poll() is None else []
        self.process.send_signal(sig)
        return self.process.wait(timeout=timeout), tree
