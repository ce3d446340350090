"""The quickstart runs as written: ``docs/quickstart.md``'s blocks, in a fresh clone.

The page is read from the clone, so the page and the code it runs are the same
commit. Its commands run exactly as printed, both terminals opened in the
clone's root folder, with ``keel up`` in the background as the reader's first
terminal (``tests/docs/walkthrough.py`` says how blocks are marked and run).
The reader's own folder (``~/hello-jobs``) is under a ``HOME`` of the test's,
outside the clone: the module ``keel up`` loads and the script the second
terminal runs are there, where nothing of the clone's tree imports them.

One step is done differently, and the page's marker says so: the page's
install block (``python3 -m venv --upgrade-deps .venv && .venv/bin/pip install -e
'.[embedded,flower]' -e ./sandbox``) is not run. Installing Keel's dependencies
from the package index takes minutes and the network; instead the clone's ``.venv``
is a link to the venv running this test (installed from the same kind of checkout,
``-e '.[test]' -e ./sandbox``: every extra and the sandbox), and
``PYTHONPATH`` names the clone, so that every process the page starts imports
the clone's packages rather than the checkout that venv was installed from
(without it, ``keel up`` in the clone would find the clone's ``tasks`` hiding
the installed one, and refuse to start).

The stack's ports are free ones, not the defaults, set in the first terminal
only (``KEEL_WEB_PORT`` and the others, as a reader whose port 8000 is taken
sets them for ``keel up``): the second terminal was never told them, so its
commands work only by asking the running stack where it answers (``keel url``,
``keel env``). ``XDG_RUNTIME_DIR`` is the test's own, so the stack registers
where no other ``keel up`` looks. 1 to 2 minutes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from keel.embedded import free_port
from tests.docs.walkthrough import Terminals, runnable, walk
from tests.support.stack import PROJECT_ROOT

PAGE = Path("docs/quickstart.md")


def reader_environment(clone: Path, home: Path, runtime: Path) -> dict[str, str]:
    """The test run's environment without its ``KEEL_*``: nothing of Keel's configured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(clone), env.get("PYTHONPATH")])),
        HOME=str(home),
        XDG_RUNTIME_DIR=str(runtime),
    )
    return env


def moved_ports() -> dict[str, str]:
    """The first terminal's own: every port of the stack moved off its default."""
    return {
        "KEEL_WEB_PORT": str(free_port()),
        "KEEL_FLOWER_PORT": str(free_port()),
        "KEEL_SANDBOX_PORT": str(free_port()),
    }


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


def test_the_second_terminal_names_no_port():
    # It asks the stack where it answers; a port written here is one the reader may not have
    for block in runnable((PROJECT_ROOT / PAGE).read_text()):
        if block.action == "run":
            assert not re.search(r":\d{2,5}\b|_PORT\b", block.text), block.text


@pytest.mark.stack
def test_the_quickstart_runs_as_written(clone: Path):
    markdown = (clone / PAGE).read_text()
    logs = clone.parent / "logs"
    logs.mkdir()
    home = clone.parent / "home"
    home.mkdir()
    env = reader_environment(clone, home, clone.parent / "runtime")
    terminals = Terminals(
        clone, env, state=logs / "shell-state", logs=logs, first_env={**env, **moved_ports()}
    )
    try:
        walk(markdown, terminals)
        # The second terminal worked in the reader's folder, outside the checkout
        assert not terminals.here.is_relative_to(clone), terminals.here
        assert (terminals.here / "try_hello.py").is_file()
        # Ctrl+C in the first terminal: every part stops, keel up exits cleanly
        assert terminals.interrupt_first() == 0, terminals.first_log()
    finally:
        terminals.close()
