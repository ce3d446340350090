"""The quickstart runs as written: ``docs/quickstart.md``'s blocks, in a fresh clone.

The page is read from the clone, so the page and the code it runs are the same
commit. Its commands run exactly as printed, in the clone's root folder, with
``keel up`` in the background as the reader's first terminal
(``tests/docs/walkthrough.py`` says how blocks are marked and run).

One step is done differently, and the page's marker says so: the page's
install block (``python3 -m venv .venv && .venv/bin/pip install -e .``) is not
run. Installing Keel's dependencies from the package index takes minutes and
the network; instead the clone's ``.venv`` is a link to the venv running this
test (installed from the same kind of checkout, ``-e '.[test]'``), and
``PYTHONPATH`` names the clone, so that every process the page starts imports
the clone's packages rather than the checkout that venv was installed from
(without it, ``keel up`` in the clone would find the clone's ``tasks`` hiding
the installed one, and refuse to start).

The stack's ports are free ones (``KEEL_WEB_PORT`` and the others, which the
page's commands honour); ``XDG_RUNTIME_DIR`` is the test's own, so the stack
registers where no other ``keel up`` looks. ~1 minute.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from keel.embedded import free_port
from tests.docs.walkthrough import Terminals, runnable, walk
from tests.support.stack import PROJECT_ROOT

pytestmark = pytest.mark.stack

PAGE = Path("docs/quickstart.md")


def reader_environment(clone: Path, runtime: Path) -> dict[str, str]:
    """The test run's environment without its ``KEEL_*``: nothing configured but ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(clone), env.get("PYTHONPATH")])),
        XDG_RUNTIME_DIR=str(runtime),
        KEEL_WEB_PORT=str(free_port()),
        KEEL_FLOWER_PORT=str(free_port()),
        KEEL_SANDBOX_PORT=str(free_port()),
    )
    return env


@pytest.fixture
def clone():
    # Short: the embedded Postgres's socket lives under ./.keel, within a 107-byte path.
    where = Path(tempfile.mkdtemp(prefix="keel-qs-"))
    folder = where / "keel"
    subprocess.run(
        ["git", "clone", "--quiet", str(PROJECT_ROOT), str(folder)],
        check=True,
        timeout=120,
    )
    (folder / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    yield folder
    shutil.rmtree(where, ignore_errors=True)


def test_every_code_block_of_the_quickstart_is_marked():
    blocks = runnable((PROJECT_ROOT / PAGE).read_text())
    actions = [block.action for block in blocks]
    assert actions.count("background") == 1
    assert "run" in actions and "file" in actions


def test_the_quickstart_runs_as_written(clone: Path):
    markdown = (clone / PAGE).read_text()
    logs = clone.parent / "logs"
    logs.mkdir()
    env = reader_environment(clone, clone.parent / "runtime")
    terminals = Terminals(clone, env, state=logs / "shell-state", logs=logs)
    try:
        walk(markdown, terminals)
        # Ctrl+C in the first terminal: every part stops, keel up exits cleanly
        assert terminals.interrupt_first() == 0, terminals.first_log()
    finally:
        terminals.close()
