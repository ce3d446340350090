"""Noticing a module of yours called ``tasks`` that hides Keel's ``tasks`` package.

Keel's job layer is the package ``tasks`` (``celery -A tasks``). A Celery
project often has its own ``tasks.py``; where that one comes first on the
import path — the current directory for ``python -m …`` and every process
``keel up`` starts, or ``PYTHONPATH`` — nothing of Keel's would import, with
an error that does not say why. The CLI says why, in one line.
"""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from pathlib import Path

OURS = Path(__file__).resolve().parent.parent / "tasks"


def _found_in(directories: list[str]) -> Path | None:
    spec = PathFinder.find_spec("tasks", directories)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve()


def shadowing_tasks_module(first_on_path: Path | None = None) -> str | None:
    """Why Keel's ``tasks`` would not be the one imported, or ``None`` if it would.

    ``first_on_path``: a directory that Keel's processes put first on their
    import path (``keel up``'s working directory).
    """
    directories = [str(first_on_path)] if first_on_path is not None else []
    found = _found_in(directories + [p or "." for p in sys.path])
    if found is None or found.parent == OURS or found == OURS:
        return None
    return (
        f"a module named 'tasks' ({found}) hides Keel's own 'tasks' package; "
        "rename yours (e.g. myapp/jobs.py, then keel up --include myapp.jobs) "
        "or start keel from another directory"
    )
