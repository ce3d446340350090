"""Importing configuration or the ``keel`` command does not build the Celery app.

Checked in a fresh interpreter, where ``sys.modules`` shows exactly what an
import pulled in (this suite's own process has long imported Celery).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.stack import PROJECT_ROOT


def modules_after(statement: str, env: dict[str, str] | None = None) -> set[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


@pytest.mark.parametrize("module", ["tasks.platform.config", "keel.cli"])
def test_importing_configuration_or_the_cli_imports_no_celery(module):
    loaded = modules_after(f"import {module}")
    assert module in loaded
    assert not {m for m in loaded if m == "celery" or m.startswith("celery.")}
    assert "tasks.celery" not in loaded


def test_celery_dash_a_tasks_still_finds_the_app():
    # ``celery -A tasks`` resolves the app this way (Celery falls back to tasks.celery)
    loaded = modules_after(
        "from celery.app.utils import find_app\n"
        "app = find_app('tasks')\n"
        "assert app.main == 'keel', app\n"
        "assert 'reports' in {q.name for q in app.conf.task_queues}"
    )
    assert "tasks.celery" in loaded


def test_keel_token_loads_no_web_framework_store_or_broker_client(tmp_path):
    # `keel token` signs a JWT with the configured key: Flask, SQLAlchemy, psycopg, redis and
    # kombu cost it most of a second to import, and it needs none of them
    loaded = modules_after(
        "import sys\n"
        "sys.argv = ['keel', 'token', '--tenant', 't', '--user', 'u']\n"
        "from keel.cli import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code",
        env={"KEEL_HOME": str(tmp_path), "KEEL_SECRET_KEY": "k" * 48},
    )
    assert "web.tokens" in loaded and "jwt" in loaded
    heavy = {"flask", "sqlalchemy", "psycopg", "redis", "kombu", "celery"}
    assert {m.split(".")[0] for m in loaded} & heavy == set()
