"""No host name of the system reaches a tenant: a job's runs name no worker and no pid in
the API or the dashboard (its record keeps them, for ``keel jobs show``), and the views
that name workers and beat by host (``/api/v1/system/status``) take the metrics token only
(``tests/api/test_metrics_access.py``).

Jobs run on a real Celery worker inside the test process (``inline_worker``), which runs
them under this host's name.
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.support.client import bearer, record, unique
from tests.support.inline import join
from tests.support.ui import PAGE, signed_in

pytestmark = pytest.mark.usefixtures("inline_worker")

TENANT = unique("hosts")
ALICE = bearer(TENANT, "alice")
OPERATOR = bearer(TENANT, "olga", roles=("operator",))
HOST_FIELDS = {"worker", "pid"}


@pytest.fixture(scope="module")
def ran(app) -> dict:
    """A report of alice's, run to completion; its record as the system keeps it."""
    client = app.test_client()
    accepted = client.post("/api/v1/reports", json={"reportId": unique(), "rows": 3}, headers=ALICE)
    assert accepted.status_code == 202, accepted.get_data(as_text=True)
    job_id = accepted.get_json()["jobId"]
    assert join([job_id])[job_id]["state"] == "completed"
    kept = record(job_id)
    assert kept is not None
    # The control: the record names the worker and pid of its run, and that is this host
    [run] = kept["runs"]
    assert set(run) >= HOST_FIELDS and socket.gethostname() in run["worker"]
    return kept


def assert_no_host(view: dict, kept: dict) -> None:
    assert len(view["runs"]) == len(kept["runs"]) and view["runs"], view
    for run in view["runs"]:
        assert not HOST_FIELDS & set(run), run
        assert run["startedAt"] and run["outcome"]  # the rest of the timeline stays
    text = json.dumps(view)
    worker = kept["runs"][0]["worker"]
    assert json.dumps(worker) not in text and f"@{socket.gethostname()}" not in text


@pytest.mark.parametrize("headers", [ALICE, OPERATOR], ids=["owner", "operator"])
def test_the_api_shows_a_jobs_runs_without_their_worker(client, ran, headers):
    job_id = ran["jobId"]
    for url in (f"/api/v1/jobs/{job_id}", f"/api/v1/reports/jobs/{job_id}"):
        response = client.get(url, headers=headers)
        assert response.status_code == 200, (url, response.get_data(as_text=True))
        assert_no_host(response.get_json(), ran)
    listed = client.get("/api/v1/jobs?name=report.generate", headers=headers).get_json()["jobs"]
    [shown] = [job for job in listed if job["jobId"] == job_id]
    assert_no_host(shown, ran)


@pytest.mark.parametrize("roles", [(), ("operator",)], ids=["owner", "operator"])
def test_the_dashboard_shows_a_jobs_runs_without_their_worker(app, ran, roles):
    job_id = ran["jobId"]
    who = signed_in(app, TENANT, "alice" if not roles else "olga", roles)
    state = who.get(f"/ui/jobs/{job_id}/state")
    assert state.status_code == 200
    assert_no_host(state.get_json(), ran)
    for url in (f"/ui/jobs/{job_id}", "/ui/jobs"):
        page = who.get(url, headers=PAGE)
        assert page.status_code == 200 and job_id[:8] in page.get_data(as_text=True)
        text = page.get_data(as_text=True)
        worker = ran["runs"][0]["worker"]
        assert f"· {worker}" not in text and f">{worker}<" not in text, url
        assert f"@{socket.gethostname()}" not in text, url
