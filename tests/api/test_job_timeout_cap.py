"""``KEEL_MAX_JOB_TIMEOUT_S``: the longest ``timeout`` a job may ask for.

A run that outlasts a worker's shutdown grace is killed by a rollout and runs again as
stalled, so a deployment caps the timeout at what its workers' grace covers
(``deploy/kubernetes``). Past the cap, the API answers its 400 validation error naming
``opts.timeout`` and adds nothing; at the cap, the job is added. ``JobOptions`` (what
``keel.add`` takes) refuses it too, while a record added before the cap was lowered keeps
its timeout.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.jobs import JobOptions
from tasks.jobs.model.options import MAX_TIMEOUT_MS
from tasks.platform.config import Settings, reload_settings
from tests.support.client import bearer, unique

URL = "/api/v1/jobs"
DAY_MS = 86_400_000
CAP_S = 60


def operator(tenant: str) -> dict:
    return bearer(tenant=tenant, user="ops", roles=("operator",))


@pytest.fixture
def cap_ms(stack, monkeypatch):
    """The cap lowered to a minute for the test, as a deployment's ConfigMap lowers it."""
    monkeypatch.setenv("KEEL_MAX_JOB_TIMEOUT_S", str(CAP_S))
    reload_settings()
    try:
        yield CAP_S * 1000
    finally:
        monkeypatch.delenv("KEEL_MAX_JOB_TIMEOUT_S")
        reload_settings()


def submit(client, headers: dict, timeout: int):
    # Delayed by a day: the job is recorded, and nothing runs it meanwhile.
    body = {"name": "test.echo", "opts": {"timeout": timeout, "delay": DAY_MS}}
    return client.post(URL, json=body, headers=headers)


def test_a_timeout_over_the_cap_is_a_400_naming_opts_timeout(client, cap_ms):
    # Given alice of a tenant, and a cap of a minute
    headers = bearer(tenant=unique("t"), user="alice")
    # When she submits a job whose timeout is a millisecond over it
    response = submit(client, headers, cap_ms + 1)
    # Then the API answers its validation error, naming the field and the cap
    assert response.status_code == 400, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error", "message", "details"}
    assert body["error"] == "validation_failed"
    [detail] = body["details"]
    assert detail["field"] == "opts.timeout" and detail["type"] == "value_error"
    assert f"KEEL_MAX_JOB_TIMEOUT_S={CAP_S}" in detail["message"], detail
    # And nothing was added for her
    listed = client.get(URL, headers=headers).get_json()
    assert listed["jobs"] == []


def test_a_timeout_at_the_cap_is_accepted(client, cap_ms):
    headers = bearer(tenant=unique("t"), user="alice")
    response = submit(client, headers, cap_ms)
    assert response.status_code == 202, response.get_data(as_text=True)
    shown = client.get(response.get_json()["statusUrl"], headers=headers).get_json()
    assert shown["opts"]["timeout"] == cap_ms


def test_a_scheduler_templates_timeout_over_the_cap_is_a_400(client, cap_ms):
    tenant = unique("t")
    body = {"every": 60_000, "template": {"name": "test.echo", "opts": {"timeout": cap_ms + 1}}}
    response = client.put(
        f"/api/v1/schedulers/{unique('capped')}", json=body, headers=operator(tenant)
    )
    assert response.status_code == 400, response.get_data(as_text=True)
    body = response.get_json()
    assert body["error"] == "validation_failed"
    assert [d["field"] for d in body["details"]] == ["template.opts.timeout"]
    listed = client.get("/api/v1/schedulers", headers=operator(tenant)).get_json()
    assert listed["schedulers"] == []


def test_the_api_document_states_the_cap(client, cap_ms):
    schemas = client.get("/api/v1/openapi.json").get_json()["components"]["schemas"]
    for model in ("SubmitOptions", "TemplateOptions"):
        timeout = schemas[model]["properties"]["timeout"]
        [integer] = [v for v in timeout.get("anyOf", [timeout]) if v.get("type") == "integer"]
        assert integer["maximum"] == cap_ms, model


def test_job_options_refuse_a_timeout_over_the_cap_and_records_keep_theirs(cap_ms):
    with pytest.raises(ValidationError, match=f"KEEL_MAX_JOB_TIMEOUT_S={CAP_S}"):
        JobOptions(timeout=cap_ms + 1)
    assert JobOptions(timeout=cap_ms).timeout == cap_ms
    # A job recorded before the cap was lowered is still read (claimed, ended) as it was.
    assert JobOptions.from_stored({}, {"timeout": cap_ms + 1}).timeout == cap_ms + 1


def test_unset_the_cap_is_a_day_as_before(stack):
    assert Settings().max_job_timeout_s * 1000 == MAX_TIMEOUT_MS
    assert JobOptions(timeout=MAX_TIMEOUT_MS).timeout == MAX_TIMEOUT_MS


def test_a_celery_calls_time_limits_over_the_cap_are_refused_and_record_nothing(cap_ms):
    from sqlalchemy import text

    from tasks.platform.db import transaction
    from tests.support.jobs import celery_add

    job_id = unique("over-cap")
    for option in ("time_limit", "soft_time_limit"):
        with pytest.raises(ValueError, match=f"{option} must be at most {CAP_S} s"):
            celery_add.apply_async((1, 2), task_id=job_id, countdown=86_400, **{option: CAP_S + 1})
    with transaction() as session:
        found = session.execute(text("SELECT count(*) FROM jobs WHERE id = :id"), {"id": job_id})
        assert found.scalar_one() == 0
    # At the cap, the call is recorded with its limit
    at_cap = celery_add.apply_async((1, 2), countdown=86_400, time_limit=CAP_S)
    with transaction() as session:
        ctx = session.execute(
            text("SELECT celery_ctx FROM jobs WHERE id = :id"), {"id": at_cap.id}
        ).scalar_one()
    assert ctx["timelimit"] == [CAP_S, None]
