"""A user's project of its own: files in a folder, and its pytest run in a process of its own.

The process inherits nothing of this suite's ``KEEL_*`` settings (``settings`` gives what
the project would have), as a project's own test run would not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_pytest(
    folder: Path, files: dict[str, str], settings: dict[str, str] | None = None, *args: str
) -> subprocess.CompletedProcess[str]:
    """Write ``files`` into ``folder`` and run pytest there; fails the caller's test, with
    the project's output, if that run does not pass."""
    for name, text in files.items():
        (folder / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(settings or {})
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    done = subprocess.run(
        [*command, "--rootdir", str(folder), *args, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done
