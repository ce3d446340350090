"""Job logs with a real worker: ``job.log()`` / ``self.log()`` lines stored with the job,
read by ``GET /api/v1/jobs/<id>/logs``, bounded, owner-scoped, and deleted with the job."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tasks.jobs.store.logs import MAX_LINE_CHARS
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tests.support import jobs as test_jobs
from tests.support.client import bearer, unique, wait_state

pytestmark = pytest.mark.usefixtures("worker")


def submit(client, headers, **data) -> str:
    body = {"name": "test.logs", "data": data, "opts": {"attempts": 2}}
    response = client.post("/api/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.get_json()
    return response.get_json()["jobId"]


def logs(client, job_id: str, headers, **query) -> tuple[int, dict]:
    response = client.get(f"/api/v1/jobs/{job_id}/logs", headers=headers, query_string=query)
    return response.status_code, response.get_json()


def test_a_handlers_lines_are_kept_with_the_run_that_wrote_them(client):
    alice = bearer(unique("t"), "alice")
    job_id = submit(client, alice, lines=3, failFirst=True)
    job = wait_state(job_id, "completed", "failed", timeout=60)
    assert job["state"] == "completed" and job["attemptsStarted"] == 2, job
    status, body = logs(client, job_id, alice)
    assert status == 200, body
    assert [(line["seq"], line["attempt"], line["message"]) for line in body["logs"]] == [
        (1, 1, "line 0 of run 1"),
        (2, 1, "line 1 of run 1"),
        (3, 1, "line 2 of run 1"),
        (4, 2, "line 0 of run 2"),
        (5, 2, "line 1 of run 2"),
        (6, 2, "line 2 of run 2"),
    ]
    assert body["written"] == 6 and body["next"] is None
    assert job["result"] == {"last": 6}  # job.log() answers the line's number
    # A page at a time
    status, first = logs(client, job_id, alice, limit=4)
    assert status == 200
    assert [line["seq"] for line in first["logs"]] == [1, 2, 3, 4] and first["next"] == 4
    status, rest = logs(client, job_id, alice, after=first["next"], limit=4)
    assert [line["seq"] for line in rest["logs"]] == [5, 6] and rest["next"] is None


def test_ten_thousand_lines_keep_the_newest_as_configured(client):
    alice = bearer(unique("t"), "alice")
    job_id = submit(client, alice, lines=10_000)
    job = wait_state(job_id, "completed", "failed", timeout=180)
    assert job["state"] == "completed", job
    keep = get_settings().job_log_lines
    with transaction() as session:
        stored = session.execute(
            text("SELECT count(*), min(seq), max(seq) FROM job_logs WHERE job_id = :id"),
            {"id": job_id},
        ).one()
    assert tuple(stored) == (keep, 10_000 - keep + 1, 10_000)
    status, body = logs(client, job_id, alice, limit=1000)
    assert status == 200 and body["written"] == 10_000
    assert body["logs"][0]["seq"] == 10_000 - keep + 1
    assert body["logs"][-1]["message"] == "line 9999 of run 1"


def test_a_celery_task_writes_its_log_with_self_log():
    result = test_jobs.celery_logs.delay("x" * (MAX_LINE_CHARS + 10))
    assert result.get(timeout=30) == 2
    job = wait_state(result.id, "completed")
    with transaction() as session:
        rows = session.execute(
            text("SELECT seq, message FROM job_logs WHERE job_id = :id ORDER BY seq"),
            {"id": job["jobId"]},
        ).all()
    assert [row.seq for row in rows] == [1, 2] and rows[1].message == "done"
    assert len(rows[0].message) == MAX_LINE_CHARS and rows[0].message.endswith("…")


def test_only_who_may_see_the_job_reads_its_log_and_the_log_goes_with_the_job(client):
    tenant = unique("t")
    alice = bearer(tenant, "alice")
    job_id = submit(client, alice, lines=2)
    assert wait_state(job_id, "completed", "failed", timeout=60)["state"] == "completed"
    # Another tenant, another user: as if there were no such job; the tenant's operator reads it
    assert logs(client, job_id, bearer(unique("t"), "alice"))[0] == 404
    assert logs(client, job_id, bearer(tenant, "bob"))[0] == 404
    status, body = logs(client, job_id, bearer(tenant, "ops", ("operator",)))
    assert status == 200 and body["written"] == 2
    # Bad paging is a 400 in the error shape
    for query in ({"limit": 0}, {"after": -1}, {"limit": "x"}, {"sort": "asc"}):
        status, error = logs(client, job_id, alice, **query)
        assert status == 400 and error["error"] == "validation_failed", (query, error)
    # A deleted job's lines are gone with it
    with transaction() as session:
        session.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job_id})
        left = session.execute(
            text("SELECT count(*) FROM job_logs WHERE job_id = :id"), {"id": job_id}
        ).scalar_one()
    assert left == 0
