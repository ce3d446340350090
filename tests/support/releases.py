"""The previous release, read from this clone's history: what a rolling upgrade runs beside
this checkout (docs/operations/upgrading.md)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import types
from io import BytesIO
from pathlib import Path

from tests.support.stack import PROJECT_ROOT

# The release before this one (CHANGELOG.md), moved on at each release. Its commit is
# pinned as well as its tag: tags do not travel with every clone (a landing pushes the
# branch only), the commit is in main's history wherever main is.
PREVIOUS = "v0.3.0"
PREVIOUS_COMMIT = "481a93e7e5b9f1d28978ff00d8ad559cbd090768"

_GIT = ["git", "-C", str(PROJECT_ROOT)]


def _from_history(*args: str) -> bytes:
    """``git <args>`` on the previous release's commit (fetched from the clone's origin
    first if the clone is shallow)."""
    tagged = subprocess.run(
        [*_GIT, "rev-parse", "--verify", "--quiet", f"{PREVIOUS}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if tagged.returncode == 0:
        assert tagged.stdout.strip() == PREVIOUS_COMMIT, (
            f"tag {PREVIOUS} is {tagged.stdout.strip()}, the tests pin {PREVIOUS_COMMIT}"
        )
    found = subprocess.run([*_GIT, *args], capture_output=True)
    if found.returncode != 0:
        subprocess.run([*_GIT, "fetch", "--quiet", "--unshallow", "origin"], capture_output=True)
        found = subprocess.run([*_GIT, *args], capture_output=True)
    assert found.returncode == 0, (
        f"the previous release {PREVIOUS} ({PREVIOUS_COMMIT}) is not in this clone's history "
        f"(a shallow clone? git fetch --unshallow): {found.stderr.decode(errors='replace')}"
    )
    return found.stdout


def previous_tree(into: Path) -> Path:
    """The previous release's source tree, extracted into ``into``."""
    found = _from_history("archive", "--format=tar", PREVIOUS_COMMIT)
    with tarfile.open(fileobj=BytesIO(found)) as archive:
        archive.extractall(into, filter="data")
    return into


def previous_module(path: str) -> types.ModuleType:
    """One module of the previous release (``path`` in its tree), loaded on its own under a
    name of its own: for a module that imports nothing of Keel's, such as its options."""
    name = "previous_release_" + path.removesuffix(".py").replace("/", "_")
    module = types.ModuleType(name)
    module.__file__ = f"{PREVIOUS}:{path}"
    sys.modules[name] = module  # pydantic resolves the module's annotations through it
    source = _from_history("show", f"{PREVIOUS_COMMIT}:{path}").decode()
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module
