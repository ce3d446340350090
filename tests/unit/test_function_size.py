"""No product function is longer than a reader can follow: 80 lines at most.

A function's length is its ``def`` line to its last line (``end_lineno - lineno + 1``),
docstring and comments included, decorators not. Methods and nested functions count
on their own, and a nested function counts within the one that holds it too. The
product is ``tasks/``, ``web/``, ``keel/``, the provider sandbox
(``sandbox/provider_sandbox/``) and ``migrations/`` (its ``versions/`` are generated, and
reviewed as migrations); ``tests/``, ``bench/``, ``docs/`` and ``examples/`` are not.

A function too long fails the test, which lists every one as ``path:line name (N
lines)``. There is no allow-list: ``PENDING`` may only name functions in files this
change may not touch (owned elsewhere at the time), and an entry that no longer needs
to be there fails the test too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.stack import PROJECT_ROOT

LIMIT = 80
PRODUCT = ("tasks", "web", "keel", "sandbox/provider_sandbox", "migrations")
GENERATED = (("migrations", "versions"),)

# Functions over the limit that cannot be split yet, as ``path::qualified name``: only
# in files edited elsewhere at the time (keel/stack.py, keel/cli.py, keel/flower.py,
# tasks/platform/tracing.py, tasks/platform/migrate.py, the provider sandbox). Empty: none.
PENDING: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Function:
    path: str
    line: int
    name: str
    lines: int

    @property
    def key(self) -> str:
        return f"{self.path}::{self.name}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.lines} lines)"


def functions(source: str, path: str) -> list[Function]:
    """Every function and method in ``source``, named by where it is (``Class.method``)."""
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                end = child.end_lineno or child.lineno
                found.append(Function(path, child.lineno, name, end - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename=path), "")
    return found


def product_modules(root: Path = PROJECT_ROOT) -> list[Path]:
    modules = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).parts
            if not any(parts[: len(skip)] == skip for skip in GENERATED):
                modules.append(path)
    return modules


def too_long(modules: list[Path], limit: int = LIMIT, root: Path = PROJECT_ROOT) -> list[Function]:
    every = []
    for path in modules:
        relative = path.relative_to(root).as_posix()
        every += functions(path.read_text(encoding="utf-8"), relative)
    return [function for function in every if function.lines > limit]


def test_no_product_function_is_over_the_limit():
    long = [f for f in too_long(product_modules()) if f.key not in PENDING]
    listed = "\n".join(str(function) for function in sorted(long, key=lambda f: -f.lines))
    if long:
        pytest.fail(f"{len(long)} functions over {LIMIT} lines:\n{listed}", pytrace=False)


def test_every_pending_function_is_still_too_long():
    still = {function.key for function in too_long(product_modules())}
    done = sorted(PENDING - still)
    if done:
        gone = "\n".join(done)
        pytest.fail(
            f"no longer over the limit (or gone), take out of PENDING:\n{gone}", pytrace=False
        )


def test_the_tree_is_walked():
    assert all((PROJECT_ROOT / package).is_dir() for package in PRODUCT), PRODUCT
    modules = product_modules()
    names = {path.relative_to(PROJECT_ROOT).as_posix() for path in modules}
    assert {
        "tasks/jobs/run/execute.py",
        "web/__init__.py",
        "sandbox/provider_sandbox/app.py",
    } <= names
    assert not any(name.startswith("migrations/versions/") for name in names)
    assert len(too_long(modules, limit=5)) > 100  # a lower limit finds functions: it measures


def method_of(lines: int) -> str:
    """A class whose method ``run`` is ``lines`` lines long, its docstring one of them."""
    body = "".join(f"        x{i} = {i}\n" for i in range(lines - 2))
    return f'class Worker:\n    def run(self):\n        """Doc."""\n{body}'


def listed(source: str) -> list[str]:
    return [str(f) for f in functions(source, "tasks/example.py") if f.lines > LIMIT]


def test_a_long_method_is_listed_with_its_place_and_length():
    assert listed(method_of(LIMIT)) == []
    assert listed(method_of(LIMIT + 1)) == [f"tasks/example.py:2 Worker.run ({LIMIT + 1} lines)"]
    nested = "def outer():\n    def inner():\n        pass\n    return inner\n"
    assert [f.name for f in functions(nested, "m.py")] == ["outer", "outer.inner"]
