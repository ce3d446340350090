"""Migrations only expand: nothing the previous release reads is dropped or renamed.

A rolling upgrade runs ``keel db upgrade`` while the previous release's
workers and API still run, so a migration may only add what they ignore
(tables, nullable or defaulted columns, indexes, functions). Removing or
renaming a column or table they use waits one release: the release that
stops using it ships first; the next one drops it, in a migration that says
so in a module-level ``CONTRACT = "<what stopped using it, and in which
release>"``. This test reads every migration's ``upgrade()`` and refuses a
destructive operation without that statement (``downgrade()`` is exempt:
it runs with the new release's processes stopped).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.stack import PROJECT_ROOT

VERSIONS = PROJECT_ROOT / "migrations" / "versions"
DESTRUCTIVE_OPS = {"drop_column", "drop_table", "rename_table"}
DESTRUCTIVE_SQL = re.compile(
    r"\b(DROP\s+(COLUMN|TABLE)|RENAME\s+(COLUMN|TO)|ALTER\s+COLUMN\s+\S+\s+(SET\s+NOT\s+NULL|TYPE))\b",
    re.IGNORECASE,
)


def _not_null_without_default(add_column: ast.Call) -> bool:
    """``op.add_column(table, sa.Column(..., nullable=False))`` with no ``server_default``:
    the previous release's inserts, which do not name the column, would fail."""
    for column in add_column.args[1:2]:
        if not isinstance(column, ast.Call):
            continue
        keywords = {k.arg: k.value for k in column.keywords}
        nullable = keywords.get("nullable")
        if (
            isinstance(nullable, ast.Constant)
            and nullable.value is False
            and "server_default" not in keywords
        ):
            return True
    return False


def destructive_steps(source: str) -> list[str]:
    """What ``upgrade()`` does that the previous release could trip over, unless declared."""
    tree = ast.parse(source)
    declared = any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "CONTRACT" for t in node.targets)
        for node in tree.body
    )
    upgrades = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "upgrade"]
    found = []
    for function in upgrades:
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name = node.func.attr
            keywords = {k.arg for k in node.keywords}
            if name in DESTRUCTIVE_OPS:
                found.append(f"op.{name} (line {node.lineno})")
            elif name == "alter_column" and keywords & {"new_column_name", "type_"}:
                found.append(f"op.alter_column renaming or retyping (line {node.lineno})")
            elif name == "alter_column" and any(
                k.arg == "nullable" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.keywords
            ):
                found.append(f"op.alter_column to NOT NULL (line {node.lineno})")
            elif name == "add_column" and _not_null_without_default(node):
                found.append(
                    f"op.add_column NOT NULL without a server default (line {node.lineno})"
                )
            for arg in node.args:
                text = arg.value if isinstance(arg, ast.Constant) else None
                match = DESTRUCTIVE_SQL.search(text) if isinstance(text, str) else None
                if match:
                    found.append(f"SQL {match.group(0)!r} (line {node.lineno})")
    return [] if declared else found


def test_every_migration_only_expands():
    versions = sorted(VERSIONS.glob("[0-9]*.py"))
    assert versions, "no migrations found"
    refused = {p.name: steps for p in versions if (steps := destructive_steps(p.read_text()))}
    assert refused == {}, (
        "a migration removes or renames what the previous release may still use; ship the "
        "release that stops using it first, then drop it with CONTRACT = '...' (see this "
        f"test's docstring): {refused}"
    )


def test_the_check_refuses_a_drop_or_rename_and_takes_a_declared_contract():
    drop = """
def upgrade():
    op.add_column("jobs", sa.Column("x", sa.Text()))
    op.drop_column("jobs", "progress")

def downgrade():
    op.drop_column("jobs", "x")
"""
    rename = 'def upgrade():\n    op.alter_column("jobs", "data", new_column_name="payload")\n'
    raw = 'def upgrade():\n    op.execute("ALTER TABLE jobs RENAME COLUMN data TO payload")\n'
    additive = 'def upgrade():\n    op.add_column("jobs", sa.Column("x", sa.Text()))\n'
    assert destructive_steps(drop) == ["op.drop_column (line 4)"]
    assert destructive_steps(rename) and destructive_steps(raw)
    assert destructive_steps(additive) == []
    not_null = (
        'def upgrade():\n    op.add_column("jobs", sa.Column("x", sa.Integer(), nullable=False))\n'
    )
    defaulted = not_null.replace("nullable=False", 'server_default="1", nullable=False')
    assert destructive_steps(not_null) == [
        "op.add_column NOT NULL without a server default (line 2)"
    ]
    assert destructive_steps(defaulted) == []
    assert destructive_steps('CONTRACT = "jobs.progress unused since 0.2"\n' + drop) == []


def test_the_policy_is_written_where_contributors_look():
    upgrading = (PROJECT_ROOT / "docs" / "operations" / "upgrading.md").read_text()
    assert "expand" in upgrading and "CONTRACT" in upgrading
    assert Path(__file__).name in upgrading
    development = (PROJECT_ROOT / "docs" / "development.md").read_text()
    assert "operations/upgrading.md" in development and Path(__file__).name in development
