"""Users import ``keel`` only: the docs and examples teach nothing else, and the front door
holds what they use.

Every Python block of the README and the docs (and every example module) is read for its
imports: none may name Keel's internal packages (``tasks``, ``web``, ``keel``'s submodules,
``migrations``, ``provider_sandbox``), and every name taken from ``keel`` must be one it
exports. The pages about Keel's insides (architecture, development, benchmarks) and the
generated references are left out.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import keel
from tests.support.stack import PROJECT_ROOT

INTERNAL = ("tasks", "web", "migrations", "provider_sandbox")
ABOUT_INSIDES = {"architecture.md", "development.md", "benchmarks.md"}
BLOCK = re.compile(r"^```(?:python|py)\n(.*?)^```", re.MULTILINE | re.DOTALL)
IMPORT_LINE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+(.+)|import\s+([\w., ]+))$")


def user_pages() -> list[Path]:
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]
    return [
        page
        for page in pages
        if page.name not in ABOUT_INSIDES
        and "reference" not in page.relative_to(PROJECT_ROOT).parts
    ]


def imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names) of each import; a block that is not whole Python is read line by line."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        found = []
        for line in source.splitlines():
            match = IMPORT_LINE.match(line)
            if match and match.group(1):
                names = [n.strip().split(" as ")[0] for n in match.group(2).strip("() ").split(",")]
                found.append((match.group(1), [n for n in names if n]))
            elif match:
                found += [(m.strip().split(" as ")[0], []) for m in match.group(3).split(",")]
        return found
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return found


def problems(where: str, source: str) -> list[str]:
    found = []
    for module, names in imports(source):
        root = module.split(".")[0]
        if root in INTERNAL or (root == "keel" and module != "keel"):
            found.append(f"{where}: imports {module} (internal; use `from keel import …`)")
        elif module == "keel":
            found += [f"{where}: keel has no {n}" for n in names if n not in keel.__all__]
    return found


def test_the_docs_and_examples_import_only_keels_public_names():
    found = []
    for page in user_pages():
        for block in BLOCK.findall(page.read_text()):
            found += problems(str(page.relative_to(PROJECT_ROOT)), block)
    for example in sorted((PROJECT_ROOT / "examples").glob("*.py")):
        found += problems(str(example.relative_to(PROJECT_ROOT)), example.read_text())
    assert found == []
    # (and the check itself sees an internal import, and a name keel lacks)
    assert problems("x", "from tasks.jobs import add\nfrom keel import nothing_here")


def test_the_docs_run_celery_on_keel():
    said = [
        f"{page.relative_to(PROJECT_ROOT)}: {line.strip()}"
        for page in user_pages()
        for line in page.read_text().splitlines()
        if re.search(r"celery -A tasks\b|-S tasks\.jobs", line)
    ]
    assert said == []


@pytest.mark.parametrize("name", keel.__all__)
def test_every_public_name_loads_and_says_what_it_is(name):
    value = getattr(keel, name)
    assert value is not None
    assert name in keel.__dir__()


def test_import_keel_stays_light_and_celery_finds_the_app_there():
    # Given a fresh interpreter, `import keel` builds no Celery app and loads no SQLAlchemy
    probe = (
        "import sys, keel; "
        "print(sorted(m for m in ('celery', 'sqlalchemy', 'tasks.celery') if m in sys.modules))"
    )
    light = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert light.stdout.strip() == "[]"
    # And `celery -A keel` finds Keel's app, its beat scheduler by name
    from celery.app.utils import find_app
    from kombu.utils.imports import symbol_by_name

    assert find_app("keel") is keel.app
    assert symbol_by_name("keel:KeelScheduler") is keel.KeelScheduler
    assert keel.app.conf.beat_scheduler.endswith(":KeelScheduler")
