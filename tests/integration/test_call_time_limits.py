"""A call's ``time_limit``/``soft_time_limit`` travel in Celery's ``timelimit`` header of every
message of its job (read from the broker, no worker): the first, and one published again
from the record (a delayed job promoted). What a worker does with them:
``test_time_limits.py``."""

from __future__ import annotations

import uuid

import pytest
from celery import chain
from sqlalchemy import text

from tasks.jobs import JobOptions, add
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.store import upkeep
from tasks.platform.db import transaction
from tests.support.broker_lists import headers_in
from tests.support.client import bearer, unique
from tests.support.jobs import echo

pytestmark = pytest.mark.usefixtures("stack")


def kept_context(job_id: str) -> dict:
    with transaction() as session:
        return session.execute(
            text("SELECT celery_ctx FROM jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()


def test_a_call_s_time_limits_are_in_its_message_and_on_its_record(idle_queue):
    # When a task is called with both limits, with the soft one only, and with neither
    both = echo.apply_async(kwargs={"n": 1}, queue=idle_queue, time_limit=7, soft_time_limit=5)
    soft = echo.apply_async(kwargs={"n": 2}, queue=idle_queue, soft_time_limit=2.5)
    none = echo.apply_async(kwargs={"n": 3}, queue=idle_queue)
    # Then each message carries [hard, soft] as Celery's own apply_async would send it
    headers = headers_in(idle_queue)
    assert headers[both.id]["timelimit"] == [7, 5]
    assert headers[soft.id]["timelimit"] == [None, 2.5]
    assert headers[none.id]["timelimit"] == [None, None]  # the task's or the app's, then
    # and the record keeps them, for every later message of the job
    assert kept_context(both.id)["timelimit"] == [7, 5]
    assert "timelimit" not in (kept_context(none.id) or {})


def test_a_delayed_job_s_message_carries_its_call_s_time_limits_when_due(idle_queue):
    # Given a call with a countdown and a soft time limit (no message until it is due)
    result = echo.apply_async(kwargs={"n": 1}, queue=idle_queue, countdown=60, soft_time_limit=3)
    assert headers_in(idle_queue) == {}
    # When it is promoted (as a worker's maintenance does once it is due)
    with transaction() as session:
        publish_ready(session, upkeep.promote_now(session, [result.id]))
    # Then its message carries the call's limits
    assert headers_in(idle_queue)[result.id]["timelimit"] == [None, 3]


@pytest.mark.parametrize(
    "limits",
    [
        {"time_limit": 0},
        {"soft_time_limit": -1},
        {"time_limit": "60"},
        {"soft_time_limit": True},
        {"time_limit": float("inf")},
    ],
)
def test_a_time_limit_that_is_not_a_positive_number_is_refused_and_nothing_recorded(
    idle_queue, limits
):
    task_id = uuid.uuid4().hex
    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        echo.apply_async(kwargs={"n": 1}, queue=idle_queue, task_id=task_id, **limits)
    with transaction() as session:
        found = session.execute(text("SELECT 1 FROM jobs WHERE id = :id"), {"id": task_id})
        assert found.first() is None
    assert headers_in(idle_queue) == {}


def test_a_chain_step_s_bad_time_limit_is_refused_by_the_call(idle_queue):
    # A chain's later steps are recorded only when the step before ends: checked at the call
    steps = chain(
        echo.si(n=1).set(queue=idle_queue),
        echo.si(n=2).set(queue=idle_queue, soft_time_limit=0),
    )
    with pytest.raises(ValueError, match="soft_time_limit must be a positive number"):
        steps.apply_async()
    assert headers_in(idle_queue) == {}


def test_a_job_s_timeout_option_is_its_hard_limit_unless_the_call_gives_one(idle_queue):
    # When jobs are added with a timeout option: alone, beside a call's soft limit, and
    # beside a call's own hard limit
    alone = add("test.echo", {}, queue=idle_queue, opts=JobOptions(timeout=1500)).job_id
    with_soft = echo.apply_async(
        kwargs={"n": 1}, queue=idle_queue, soft_time_limit=1, job_options={"timeout": 2500}
    ).id
    call_wins = echo.apply_async(
        kwargs={"n": 2}, queue=idle_queue, time_limit=5, job_options={"timeout": 2500}
    ).id
    # Then the timeout, in seconds, is the hard limit its messages carry, the call's wins
    headers = headers_in(idle_queue)
    assert headers[alone]["timelimit"] == [1.5, None]
    assert headers[with_soft]["timelimit"] == [2.5, 1]
    assert headers[call_wins]["timelimit"] == [5, None]
    assert kept_context(alone)["timelimit"] == [1.5, None]  # and every later message's


def test_a_job_submitted_over_http_keeps_its_timeout(client):
    headers = bearer(tenant=unique("t"), user="alice")
    body = {"name": "test.echo", "data": {}, "opts": {"timeout": 2000, "delay": 86_400_000}}
    response = client.post("/api/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.get_data(as_text=True)
    job_id = response.get_json()["jobId"]
    shown = client.get(f"/api/v1/jobs/{job_id}", headers=headers).get_json()
    assert shown["opts"]["timeout"] == 2000
    assert kept_context(job_id)["timelimit"] == [2, None]


@pytest.mark.parametrize("timeout", [0, -5, "soon", 86_400_001, 1.5])
def test_a_timeout_that_is_no_whole_positive_number_of_ms_up_to_a_day_is_400(client, timeout):
    headers = bearer(tenant=unique("t"), user="alice")
    body = {"name": "test.echo", "data": {}, "opts": {"timeout": timeout}}
    response = client.post("/api/v1/jobs", json=body, headers=headers)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert "opts.timeout" in [detail.get("field") for detail in response.get_json()["details"]]
