"""The migrations build exactly the schema the models describe."""

from __future__ import annotations

import subprocess
import sys

import pytest
from alembic import command

from tasks.platform.migrate import alembic_config
from tests.support.stack import PROJECT_ROOT


def test_models_and_migrations_agree(stack):
    # alembic check raises if autogenerate would produce any operation
    command.check(alembic_config())


@pytest.mark.parametrize("args", [["check", "--quiet"], ["format", "--check", "--quiet"]])
def test_ruff_is_clean(args):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "."],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
