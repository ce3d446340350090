"""The quickstart (docs/quickstart.md): ``examples/hello_jobs.py`` in a real ``keel up``
(started with ``--include examples.hello_jobs``), added with ``.delay()`` and over HTTP."""

from __future__ import annotations

import subprocess
import sys

import requests

from tests.acceptance.test_keel_up import user_token
from tests.support.keel_up import KeelUp
from tests.support.stack import PROJECT_ROOT, wait_for

SEND = """
from examples.hello_jobs import greet
from tasks.jobs import Owner, acting_as

with acting_as(Owner("acme", "alice")):
    print(greet.delay("ada", flaky_runs=2).id)
"""


def job(up: KeelUp, job_id: str, headers: dict[str, str]) -> dict | None:
    answer = requests.get(f"{up.web}/api/v1/jobs/{job_id}", headers=headers, timeout=10)
    return answer.json() if answer.status_code == 200 else None


def finished(up: KeelUp, job_id: str, headers: dict[str, str]) -> dict:
    def done() -> dict | None:
        found = job(up, job_id, headers)
        return found if found and found["state"] in ("completed", "failed") else None

    return wait_for(done, timeout=60, interval=0.3)


def test_the_example_module_runs_when_added_with_delay(keel_up: KeelUp):
    # Given the stack running the example module, When a program of the user's calls .delay()
    sent = subprocess.run(
        [sys.executable, "-c", SEND],
        cwd=PROJECT_ROOT,
        env={**keel_up.env, **keel_up.stack_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.strip().splitlines()[-1]
    # Then the job is a record of alice's, retried twice by Celery's autoretry, on its own queue
    done = finished(keel_up, job_id, user_token(keel_up))
    assert done["state"] == "completed", done
    assert done["queue"] == "hello"
    assert (done["attemptsMade"], done["attemptsStarted"]) == (2, 3)
    assert done["result"] == "hello, ada"


def test_the_example_module_runs_when_added_over_http(keel_up: KeelUp):
    headers = user_token(keel_up)
    accepted = requests.post(
        f"{keel_up.web}/api/v1/jobs",
        json={"name": "hello.greet", "args": ["bob"]},
        headers=headers,
        timeout=10,
    )
    assert accepted.status_code == 202, accepted.text
    done = finished(keel_up, accepted.json()["jobId"], headers)
    assert done["state"] == "completed", done
    assert done["result"] == "hello, bob"
