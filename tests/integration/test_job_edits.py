"""A delayed job edited, then promoted, with a real worker: it runs once, with its new data."""

from __future__ import annotations

import pytest

from tests.support.client import bearer, unique, wait_state

pytestmark = pytest.mark.usefixtures("worker")


def test_a_delayed_job_edited_then_promoted_runs_once_with_its_new_data(client):
    tenant = unique("t")
    alice, ops = bearer(tenant, "alice"), bearer(tenant, "ops", ("operator",))
    body = {"name": "test.echo", "data": {"n": 1}, "opts": {"delay": 3_600_000}}
    job_id = client.post("/api/v1/jobs", json=body, headers=alice).get_json()["jobId"]
    edit = {"data": {"n": 2}, "reason": "the right recipient this time"}
    assert client.put(f"/api/v1/jobs/{job_id}/data", json=edit, headers=ops).status_code == 200
    assert client.post(f"/api/v1/jobs/{job_id}/promote", headers=alice).status_code == 200
    job = wait_state(job_id, "completed", "failed", timeout=30)
    assert job["state"] == "completed" and job["result"] == {"echo": {"n": 2}}, job
    assert job["attemptsStarted"] == 1 and len(job["runs"]) == 1
