"""Files only their owner can read, private from the first byte.

``chmod`` after writing leaves a window in which the file is readable by
others; creating it with the right mode (and the supervisor's umask,
``lifeline.PRIVATE_UMASK``) does not.
"""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path) -> Path:
    """``path`` and its missing parents, created 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a fresh 0600 file holding ``text``."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_private(path: Path, text: str) -> bool:
    """Write ``path`` (0600) unless it exists; ``False`` if it was already there."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return True


def open_private_log(path: Path) -> int:
    """A log file to append to, created 0600 (a server's log can quote statements)."""
    private_dir(path.parent)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
