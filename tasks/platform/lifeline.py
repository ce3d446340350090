"""Child processes that cannot outlive the process that started them.

A supervisor killed with ``kill -9`` runs no cleanup code, so its children
must notice on their own. On Linux the kernel does it for us: a child asks
for a signal when its parent dies (``PR_SET_PDEATHSIG``), set between
``fork`` and ``exec`` and kept across ``exec``. Two caveats shape the use:

- the signal fires when the *thread* that forked the child ends, so start
  children from a thread that lives as long as the process (the main one);
- it is not inherited by the child's own children: a server that forks
  must watch its parent itself (Postgres backends, gunicorn workers and
  Celery's prefork pool all do).

Elsewhere the tie is a no-op and a crashed supervisor can leave orphans.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

PR_SET_PDEATHSIG = 1
PRIVATE_UMASK = 0o077  # files 0600, folders 0700, from the first byte
ORPHANED_EXIT = 70


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def die_with_parent(death_signal: int = signal.SIGKILL) -> None:
    """Ask for ``death_signal`` when this process's parent dies (call right after a fork)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(death_signal))


def tied_to_parent(death_signal: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn``: private umask, and ``death_signal`` when this process dies.

    Runs in the child after ``fork`` (and after ``user=``/``group=`` took
    effect, which would otherwise clear the death signal).
    """
    parent = os.getpid()

    def preexec() -> None:
        os.umask(PRIVATE_UMASK)
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, int(death_signal))
        if os.getppid() != parent:  # the parent died before the tie was made
            os._exit(ORPHANED_EXIT)

    return preexec


def stop_process(
    process: subprocess.Popen,
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGKILL),
    timeout_s: float = 30,
) -> int:
    """Send each signal in turn, waiting up to ``timeout_s`` after each but the last."""
    for index, signum in enumerate(signals):
        if process.poll() is not None:
            break
        try:
            process.send_signal(signum)
        except ProcessLookupError:
            break
        last = index == len(signals) - 1
        try:
            process.wait(timeout=None if last else timeout_s)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()
