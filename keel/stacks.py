"""The registry of running stacks, written: ``keel up`` registers its home, and unregisters it.

Reading it, and choosing a stack from it, is ``tasks.platform.stacks``: every process
that looks for a stack (the ``keel`` commands, workers, your scripts) does it
the same way.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from keel.embedded.private import private_dir, write_private
from tasks.platform.stacks import registry_dir


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
