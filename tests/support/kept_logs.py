"""A failed run's logs, kept where the next reader finds them (``KEEL_TEST_LOG_DIR``).

The servers and processes the suite starts write their logs into temporary
folders: the session's ``KEEL_HOME`` (Postgres, Redis, celery workers and beat,
gunicorn, the provider sandbox), pytest's ``tmp_path`` folders (``keel up``), a
multihost run's, RabbitMQ's or dockerd's root. Every one of them is removed by
the end of the session, and a failure seen once in a full run (the fast tier
failed 457 of its 569 tests on a fresh machine, once) went with its evidence.

``KEEL_TEST_LOG_DIR`` names a folder to keep them in; ``.ci/run`` sets one per
run. Each pytest invocation gets ``<dir>/<tier>/``, named after its ``-m``
expression, holding its tests' JUnit XML and, per process (``main``, or xdist's
``gw0``, ``gw1``, ...), its log records (``pytest.log``) and a copy of every log
file of those folders, in their layout (``home/pg/log``, ``home/redis/redis.log``,
``home/worker-main.log``, ``tmp/...``). An invocation that passed removes its
folder again: what is left is a failed run's. Unset, nothing is kept.

``tests/conftest.py`` calls the hooks; a folder removed before the session ends
is copied by whoever removes it (``keep``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "KEEL_TEST_LOG_DIR"
NODE_KEY = "keel_kept_logs"  # the tier's folder, handed to xdist's workers
MAX_BYTES = 64 * 1024 * 1024  # a longer log is kept from this far before its end
CHUNK = 1024 * 1024


@dataclass
class Kept:
    """Where this process keeps what it has: the tier's folder and its own in it."""

    tier: Path
    process: Path
    controller: bool  # the process that decides: not an xdist worker
    removed: bool = False


_session: Kept | None = None
_watched: dict[str, Path] = {}


def watch(folder: Path, label: str) -> None:
    """Keep ``folder``'s logs under ``label`` when the session ends (it must last that long)."""
    _watched[label] = folder


def keep(folder: Path, label: str, skip: tuple[str, ...] = ()) -> None:
    """Keep ``folder``'s logs under ``label`` now: for a folder removed before the end
    (``skip``: as ``copy_logs``)."""
    if _session is not None:
        copy_logs(folder, _session.process / label, skip)


def is_log(path: Path) -> bool:
    """A server's or process's log: ``*.log``, or Postgres's ``log`` in its data folder."""
    return path.name.endswith(".log") or path.name == "log"


def copy_logs(source: Path, target: Path, skip: tuple[str, ...] = ()) -> int:
    """Copy every log file under ``source`` to ``target``, in the same layout; how many.

    Best effort: a file that cannot be read is left out, never fails the session.
    Folders whose name starts with one of ``skip`` are not entered.
    """
    copied = 0
    for folder, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if not d.startswith(skip)]
        for name in files:
            path = Path(folder, name)
            if not is_log(path) or path.is_symlink() or not path.is_file():
                continue
            try:
                _copy(path, target / path.relative_to(source))
            except OSError:
                continue
            copied += 1
    return copied


def _copy(path: Path, to: Path) -> None:
    """Copy one log, private as the servers keep theirs (a log can quote statements)."""
    to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with path.open("rb") as source:
        size = os.fstat(source.fileno()).st_size
        if size > MAX_BYTES:
            source.seek(size - MAX_BYTES)
        handle = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(handle, "wb") as out:
            if size > MAX_BYTES:
                out.write(f"[first {size - MAX_BYTES} bytes left out]\n".encode())
            shutil.copyfileobj(source, out, CHUNK)


def tier_name(markexpr: str) -> str:
    """A folder name for an invocation: its ``-m`` expression, e.g. ``stack-and-not-slow``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", markexpr).strip("-") or "all"


def _fresh(folder: Path) -> Path:
    """``folder``, or ``folder-2``, ``-3``... if an earlier invocation of the run took it."""
    candidate, n = folder, 1
    while candidate.exists():
        n += 1
        candidate = folder.with_name(f"{folder.name}-{n}")
    candidate.mkdir(mode=0o700, parents=True)
    return candidate


# --- hooks, called from tests/conftest.py ----------------------------------------------


def configure(config: Any) -> None:
    """Choose this process's folders; have pytest write its log records and JUnit XML there.

    Called first among ``pytest_configure`` hooks: pytest's logging and junitxml
    plugins read their options in theirs.
    """
    global _session
    root = os.environ.get(ENV)
    workerinput = getattr(config, "workerinput", None)
    if not root:
        return
    if workerinput is not None:
        tier = workerinput.get(NODE_KEY)
        if tier is None:
            return
        _session = Kept(Path(tier), Path(tier) / workerinput["workerid"], controller=False)
    else:
        tier = _fresh(Path(root).absolute() / tier_name(config.option.markexpr or ""))
        _session = Kept(tier, tier / "main", controller=True)
        if config.pluginmanager.hasplugin("junitxml") and not config.option.xmlpath:
            config.option.xmlpath = str(tier / "junit.xml")
    logging = config.pluginmanager.hasplugin("logging")
    if logging and not (config.getoption("log_file") or config.getini("log_file")):
        config.option.log_file = str(_session.process / "pytest.log")


class XdistNodes:
    """Hands each xdist worker the tier's folder (registered when xdist is there)."""

    def pytest_configure_node(self, node: Any) -> None:
        if _session is not None:
            node.workerinput[NODE_KEY] = str(_session.tier)


def finish(config: Any, exitstatus: int) -> None:
    """Copy the watched folders' logs and this process's temporary folders'; then, in the
    process that decides, remove the tier's folder if the invocation passed.

    Called last among ``pytest_sessionfinish`` hooks: the session's fixtures are torn
    down (the servers stopped, their logs complete) and the JUnit XML is written.
    """
    if _session is None:
        return
    for label, folder in _watched.items():
        copy_logs(folder, _session.process / label)
    basetemp = getattr(getattr(config, "_tmp_path_factory", None), "_basetemp", None)
    if basetemp is not None:  # a controller's holds its workers' (popen-gw*): theirs to copy
        copy_logs(Path(basetemp), _session.process / "tmp", skip=("popen-gw",))
    if _session.controller and exitstatus == 0:
        shutil.rmtree(_session.tier, ignore_errors=True)
        _session.removed = True


def summary(config: Any) -> None:
    """Say where a failed invocation's logs are, on its last line (CI output shows it)."""
    terminalreporter = config.pluginmanager.get_plugin("terminalreporter")
    if _session is None or not _session.controller or _session.removed or not terminalreporter:
        return
    where = _session.tier
    with contextlib.suppress(ValueError):  # outside the working folder: as it is
        where = where.relative_to(Path.cwd())
    terminalreporter.write_sep("-", f"logs of this run kept in {where}/")
