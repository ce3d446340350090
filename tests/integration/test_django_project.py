"""A Django project with its Celery app made a Keel app (examples/django_project).

``celery -A proj worker`` runs its ``@shared_task``, which writes through the ORM; the
project's own tests (pytest-django, examples/django_project/tests) add jobs inside
``transaction.atomic()`` on Django's connection: a rolled-back block leaves no job, a
committed one runs once, and so does one whose process was killed between its commit and
the publish. Keel's tables and Django's share the project's one database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import PROJECT_ROOT, WorkerProcess

PROJECT = PROJECT_ROOT / "examples" / "django_project"
ENV = {
    "DJANGO_SETTINGS_MODULE": "proj.settings",
    "KEEL_BUILTIN_JOBS": "none",
    "PYTHONPATH": str(PROJECT),
}

pytestmark = pytest.mark.stack  # starts worker processes of its own


@pytest.fixture(scope="module")
def django_worker(stack):
    process = WorkerProcess(
        stack.home, "django", app="proj", cwd=PROJECT, include=None, extra_env=ENV
    )
    process.start()
    yield process
    process.stop()


def test_the_django_projects_own_tests_pass_against_a_real_worker(django_worker):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini"],
        cwd=PROJECT,
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        done.stdout[-4000:] + done.stderr[-2000:] + django_worker.log_tail()
    )
    assert "3 passed" in done.stdout, done.stdout[-2000:]
    # The worker ran Keel's semantics under Django: it loaded the project's task
    assert "shop.tasks.confirm" in django_worker.log_path.read_text(errors="replace")


# Keel's API, in a process of the project's own, made from its settings alone
API_PROCESS = """
import json
import django.apps
from web import create_app

api = create_app()
from keel import app

listed = api.test_client().get("/api/v1/jobs", headers={"Authorization": "Bearer nope"})
print(json.dumps({
    "ready": django.apps.apps.ready,
    "app": app.main,
    "confirm": "shop.tasks.confirm" in app.tasks,
    "unauthenticated": listed.status_code,
}))
"""


def test_keels_api_and_cli_set_django_up_before_the_projects_tasks_load(stack):
    """``shop.tasks`` imports ``shop.models``: without ``django.setup()`` first, the API's and
    the CLI's loading of the project's tasks would end in ``AppRegistryNotReady``."""
    env = {**os.environ, **ENV, "KEEL_CELERY_APP": "proj.celery:app"}

    def in_project(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120
        )

    api = in_project(sys.executable, "-c", API_PROCESS)
    assert api.returncode == 0, api.stderr[-3000:]
    seen = json.loads(api.stdout.strip().splitlines()[-1])
    assert seen == {"ready": True, "app": "proj", "confirm": True, "unauthenticated": 401}, seen
    keel_cli = str(Path(sys.executable).with_name("keel"))
    listed = in_project(keel_cli, "jobs", "list", "--name", "shop.tasks.confirm", "--limit", "1")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "not loaded" not in listed.stderr, listed.stderr
