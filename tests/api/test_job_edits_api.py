"""Editing one job before it runs (``tasks.jobs.intake.edits``): ``PUT /jobs/<id>/data``,
``POST /jobs/<id>/delay``, ``POST /jobs/<id>/promote``, each audited in ``job_actions``.
No worker here: what a promoted, edited job then does is tests/integration/test_job_edits.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from tasks.jobs.intake.enqueue import add
from tasks.jobs.model.models import JobAction
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner
from tasks.platform.db import transaction
from tests.support import jobs as _test_jobs  # noqa: F401  (test.echo, test.celery_logs)
from tests.support.client import bearer, ts, unique

pytestmark = pytest.mark.usefixtures("stack")


@pytest.fixture
def tenant() -> str:
    return unique("t")


def delayed(client, headers, name="test.echo", delay=3_600_000, **body) -> str:
    payload = {"name": name, "opts": {"delay": delay}, **body}
    if "data" not in body and "args" not in body:
        payload["data"] = {"n": 1}
    response = client.post("/api/v1/jobs", json=payload, headers=headers)
    assert response.status_code == 202, response.get_json()
    return response.get_json()["jobId"]


def actions(job_id: str) -> list[tuple[str, str, dict]]:
    with transaction() as session:
        rows = session.scalars(
            select(JobAction).where(JobAction.job_id == job_id).order_by(JobAction.id)
        ).all()
        return [(row.action, row.actor, row.details) for row in rows]


def test_an_operator_replaces_a_delayed_jobs_data_and_the_audit_says_who_and_why(client, tenant):
    alice, ops = bearer(tenant, "alice"), bearer(tenant, "ops", ("operator",))
    job_id = delayed(client, alice, data={"n": 1})
    body = {"data": {"n": 2}, "reason": "the customer fixed the typo"}
    # A user may not; the tenant's operator may
    refused = client.put(f"/api/v1/jobs/{job_id}/data", json=body, headers=alice)
    assert refused.status_code == 403
    response = client.put(f"/api/v1/jobs/{job_id}/data", json=body, headers=ops)
    assert response.status_code == 200, response.get_json()
    job = response.get_json()
    assert job["data"] == {"n": 2} and job["state"] == "delayed"
    [(action, actor, details)] = actions(job_id)
    assert (action, actor, details["reason"], details["changedFields"]) == (
        "update_data",
        "ops",
        body["reason"],
        ["n"],
    )
    # Digests, never the data (the audit outlives the record, which retention deletes)
    assert set(details) == {"reason", "changedFields", "before", "after"}
    assert details["before"] != details["after"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", details[k]) for k in ("before", "after"))


def test_only_a_submittable_standalone_jobs_data_is_editable(client, tenant):
    ops = bearer(tenant, "ops", ("operator",))
    body = {"data": {"n": 2}, "reason": "trying to edit what is not mine to edit"}
    # Keel's own job types (a report job here) keep their data
    run_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    report = client.post(
        "/api/v1/reports/scheduled",
        json={"reportId": unique(), "rows": 3, "runAt": run_at},
        headers=ops,
    ).get_json()["jobId"]
    response = client.put(f"/api/v1/jobs/{report}/data", json=body, headers=ops)
    assert (
        response.status_code == 409 and "only job types tenants" in response.get_json()["message"]
    )
    # So does a deduplicated job, and a chord's part
    owner = Owner(tenant, "ops")
    deduped = add(
        "test.echo",
        {"n": 1},
        queue="default",
        owner=owner,
        opts=JobOptions(delay=3_600_000, deduplication={"id": unique()}),
    ).job_id
    part = add(
        "test.echo",
        {"n": 1},
        queue="default",
        owner=owner,
        opts=JobOptions(delay=3_600_000),
        ctx={"chord": {"task": "test.echo"}, "group": unique()},
    ).job_id
    for job_id, why in ((deduped, "deduplicated"), (part, "chord")):
        response = client.put(f"/api/v1/jobs/{job_id}/data", json=body, headers=ops)
        assert response.status_code == 409 and why in response.get_json()["message"], why
    assert actions(report) == actions(deduped) == actions(part) == []


def test_new_data_is_checked_as_a_submission_is(client, tenant):
    ops = bearer(tenant, "ops", ("operator",))
    job_id = delayed(client, ops)
    reason = "checking what is refused"
    identity = {"data": {"tenantId": "other"}, "reason": reason}
    response = client.put(f"/api/v1/jobs/{job_id}/data", json=identity, headers=ops)
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["details"][0]["field"] == "data"
    for bad in (
        {"data": [1], "reason": reason},
        {"data": {}, "reason": "short"},
        {"reason": reason},
    ):
        response = client.put(f"/api/v1/jobs/{job_id}/data", json=bad, headers=ops)
        assert response.status_code == 400, (bad, response.get_json())
    # A Celery-style task's data keeps its shape
    celery_job = delayed(client, ops, name="test.celery_logs", args=["a"])
    wrong = {"data": {"x": 1}, "reason": reason}
    response = client.put(f"/api/v1/jobs/{celery_job}/data", json=wrong, headers=ops)
    assert response.status_code == 400, response.get_json()
    right = {"data": {"args": ["b"], "kwargs": {}}, "reason": reason}
    response = client.put(f"/api/v1/jobs/{celery_job}/data", json=right, headers=ops)
    assert response.status_code == 200 and response.get_json()["data"]["args"] == ["b"]
    assert [a for a, _, _ in actions(job_id)] == []  # nothing refused was recorded


def test_a_job_that_runs_or_ran_is_not_edited(client, tenant):
    ops = bearer(tenant, "ops", ("operator",))
    job_id = delayed(client, ops)
    with transaction() as session:
        session.execute(text("UPDATE jobs SET state = 'active' WHERE id = :id"), {"id": job_id})
    body = {"data": {"n": 3}, "reason": "too late to change it"}
    for method, path, json in (
        ("put", "data", body),
        ("post", "delay", {"delay": 1000}),
        ("post", "promote", None),
    ):
        response = getattr(client, method)(f"/api/v1/jobs/{job_id}/{path}", json=json, headers=ops)
        assert response.status_code == 409, (path, response.get_json())
        assert response.get_json()["error"] == "conflict"
    assert actions(job_id) == []


def test_the_owner_changes_a_delay_within_the_tenants_quota(client, tenant):
    alice = bearer(tenant, "alice")
    job_id = delayed(client, alice, delay=3_600_000)
    before = datetime.now(UTC)
    response = client.post(f"/api/v1/jobs/{job_id}/delay", json={"delay": 60_000}, headers=alice)
    assert response.status_code == 200, response.get_json()
    job = response.get_json()
    due = (ts(job["runAt"]) - before).total_seconds()
    assert job["state"] == "delayed" and 50 < due < 120, job["runAt"]
    [(action, actor, details)] = actions(job_id)
    assert (action, actor, details["delayMs"]) == ("change_delay", "alice", 60_000)
    too_far = {"delay": 400 * 86_400 * 1000}
    response = client.post(f"/api/v1/jobs/{job_id}/delay", json=too_far, headers=alice)
    assert response.status_code == 400 and response.get_json()["details"][0]["field"] == "delay"


def test_the_owner_promotes_a_delayed_job_once(client, tenant):
    alice = bearer(tenant, "alice")
    job_id = delayed(client, alice)
    response = client.post(f"/api/v1/jobs/{job_id}/promote", headers=alice)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["state"] == "waiting"
    again = client.post(f"/api/v1/jobs/{job_id}/promote", headers=alice)
    assert again.status_code == 409
    assert [a for a, _, _ in actions(job_id)] == ["promote"]


def test_the_audit_of_edits_cannot_be_rewritten(client, tenant):
    alice = bearer(tenant, "alice")
    job_id = delayed(client, alice)
    assert client.post(f"/api/v1/jobs/{job_id}/promote", headers=alice).status_code == 200
    for statement in ("UPDATE job_actions SET actor = 'x'", "DELETE FROM job_actions"):
        with pytest.raises(Exception, match="append-only"), transaction() as session:
            session.execute(text(f"{statement} WHERE job_id = :id"), {"id": job_id})
    assert len(actions(job_id)) == 1
