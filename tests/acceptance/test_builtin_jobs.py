"""``KEEL_BUILTIN_JOBS=`` (none): a deployment with only its own job modules.

The seed's report and notification apps are off: none of their job types,
queues, schedulers, endpoints, pages or metrics, and no provider sandbox;
the user's ``examples.hello_jobs`` runs end to end in a real ``keel up``.

That ``keel up`` is started from a folder of the user's, outside Keel's tree, and
includes a module of that folder too (``far_jobs``): the processes it starts run in
Keel's folder, and import the user's modules from where ``keel up`` was started.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests

from tests.acceptance.test_keel_up import user_token
from tests.acceptance.test_own_jobs import finished
from tests.support.keel_up import KEEL, KeelUp, command_line
from tests.support.stack import wait_for

pytestmark = pytest.mark.stack


def keel(up: KeelUp, *args: str) -> str:
    done = subprocess.run([KEEL, *args], env=up.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def scheduler_ids(up: KeelUp) -> list[str]:
    return [json.loads(line)["id"] for line in keel(up, "schedulers", "list").splitlines()]


def operator_token(up: KeelUp) -> dict[str, str]:
    token = keel(up, "token", "--tenant", "acme", "--user", "olga", "--role", "operator")
    return {"Authorization": f"Bearer {token.strip()}"}


FAR_JOBS = """
from celery import shared_task

from tasks.jobs import KeelTask


@shared_task(base=KeelTask, name="far.double", submittable=True)
def double(n: int) -> int:
    return 2 * n
"""
BROKEN_JOBS = "import a_package_nobody_installed  # noqa: F401\n"


@pytest.fixture(scope="module")
def users_folder(tmp_path_factory) -> Path:
    """A folder of the user's, outside Keel's tree, with a job module and a broken one."""
    folder = tmp_path_factory.mktemp("users-project")
    (folder / "far_jobs.py").write_text(FAR_JOBS)
    (folder / "broken_jobs.py").write_text(BROKEN_JOBS)
    return folder


@pytest.fixture(scope="module")
def own_jobs_only(tmp_path_factory, users_folder: Path):
    home = tmp_path_factory.mktemp("own-jobs") / "home"
    args = ("--include", "examples.hello_jobs", "--include", "far_jobs")
    up = KeelUp(home, args=args, cwd=users_folder)
    up.env["KEEL_BUILTIN_JOBS"] = ""
    up.start()
    yield up
    up.stop(signal.SIGINT)


def test_only_the_users_jobs_exist_and_run(own_jobs_only: KeelUp):
    up = own_jobs_only
    headers = user_token(up)
    operator = operator_token(up)
    # The built-in apps' endpoints do not exist, and the API does not describe them
    for method, path in (
        ("POST", "/api/v1/reports"),
        ("GET", "/api/v1/reports/queue/health"),
        ("POST", "/api/v1/campaigns"),
        ("GET", "/api/v1/campaigns/c1"),
    ):
        answer = requests.request(method, f"{up.web}{path}", json={}, headers=operator, timeout=10)
        assert answer.status_code == 404, (method, path, answer.status_code, answer.text)
        assert answer.json()["error"] == "not_found"
    paths = requests.get(f"{up.web}/api/v1/openapi.json", timeout=10).json()["paths"]
    assert not [p for p in paths if p.startswith(("/api/v1/reports", "/api/v1/campaigns"))]
    # Their job types cannot be submitted; the user's can, and completes
    refused = requests.post(
        f"{up.web}/api/v1/jobs", json={"name": "report.generate"}, headers=headers, timeout=10
    )
    assert refused.status_code == 400, refused.text
    accepted = requests.post(
        f"{up.web}/api/v1/jobs",
        json={"name": "hello.greet", "args": ["ada"]},
        headers=headers,
        timeout=10,
    )
    assert accepted.status_code == 202, accepted.text
    done = finished(up, accepted.json()["jobId"], headers)
    assert (done["state"], done["result"]) == ("completed", "hello, ada")
    # No standing schedulers of theirs (beat has started: the job above ran on its worker)
    listed = requests.get(f"{up.web}/api/v1/schedulers", headers=operator, timeout=10)
    assert listed.status_code == 200
    ids = scheduler_ids(up)
    assert "campaign-monitor" not in ids and "daily-report-cleanup" not in ids
    # Metrics name the user's queue, not theirs
    # (with the token keel up generated; without one, no metrics)
    scraper = {"Authorization": f"Bearer {up.stack_env['KEEL_METRICS_TOKEN']}"}
    assert requests.get(f"{up.web}/metrics", timeout=10).status_code == 401
    metrics = requests.get(f"{up.web}/metrics", headers=scraper, timeout=10).text
    assert 'queue="hello"' in metrics
    assert 'queue="reports"' not in metrics and 'queue="notifications"' not in metrics
    # No provider sandbox among the stack's processes
    children = psutil.Process(up.process.pid).children(recursive=True)
    assert not [p for p in children if "provider_sandbox" in " ".join(command_line(p))]


def test_a_stored_standing_scheduler_goes_when_its_app_is_turned_off(own_jobs_only: KeelUp):
    # Given campaign-monitor stored by an earlier run with the notifications app on
    up = own_jobs_only
    keel(
        up, "schedulers", "upsert", "campaign-monitor", "--every", "60000", "--name", "hello.greet"
    )
    assert "campaign-monitor" in scheduler_ids(up)
    # When beat starts again (the supervisor restarts it)
    up.child("keel beat").kill()
    # Then it removes the app's scheduler
    wait_for(lambda: "campaign-monitor" not in scheduler_ids(up), timeout=60, interval=0.5)


def test_a_module_in_the_folder_keel_up_was_started_in_runs(own_jobs_only: KeelUp, users_folder):
    up = own_jobs_only
    headers = user_token(up)
    # Over HTTP: the API process imported far_jobs from the user's folder
    accepted = requests.post(
        f"{up.web}/api/v1/jobs", json={"name": "far.double", "args": [21]}, headers=headers
    )
    assert accepted.status_code == 202, accepted.text
    done = finished(up, accepted.json()["jobId"], headers)
    assert (done["state"], done["result"]) == ("completed", 42)
    # The Celery way, from a script in that folder: the worker imported it too
    sent = subprocess.run(
        [
            sys.executable,
            "-c",
            "from far_jobs import double\n"
            "from tasks.jobs import Owner, acting_as\n"
            "with acting_as(Owner('acme', 'alice')):\n"
            "    print(double.delay(5).id)\n",
        ],
        cwd=users_folder,
        env={**up.env, **up.stack_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    done = finished(up, sent.stdout.strip().splitlines()[-1], headers)
    assert (done["state"], done["result"]) == ("completed", 10)


def test_a_module_that_does_not_import_stops_keel_up_at_once_naming_it(users_folder, tmp_path):
    up = KeelUp(tmp_path / "home", args=("--include", "far_jobs,broken_jobs"), cwd=users_folder)
    done = subprocess.run(
        [KEEL, "up", *up.args],
        cwd=users_folder,
        env=up.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "Error: job module broken_jobs: ModuleNotFoundError: "
        "No module named 'a_package_nobody_installed'"
    ], done.stderr
    assert not (tmp_path / "home" / "pg").exists()  # nothing was started
    # A module that is not there at all says where keel up looked
    done = subprocess.run(
        [KEEL, "up", "--include", "not_here_jobs"],
        cwd=users_folder,
        env=up.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert "job module not_here_jobs: ModuleNotFoundError" in line
    assert "the folder it was started in" in line
