"""The migrations build exactly the schema the models describe."""

from __future__ import annotations

import subprocess
import sys

from alembic import command

from tasks.migrate import alembic_config
from tests.support.stack import PROJECT_ROOT


def test_models_and_migrations_agree(stack):
    # alembic check raises if autogenerate would produce any operation
    command.check(alembic_config())


def test_ruff_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--quiet", "."],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
