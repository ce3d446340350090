"""Review: where a Celery user's expectation and the record diverge (inline worker)."""

from __future__ import annotations

import pytest
from celery import chain, chord
from sqlalchemy import text

from tasks.jobs.end.cancel import cancel
from tasks.jobs.end.stalls import requeue_stalled_once
from tasks.platform.db import transaction
from tests.support.client import record, ts, unique, wait_state
from tests.support.jobs import (
    celery_add,
    celery_autoretry_all,
    celery_collect,
    celery_now,
    celery_requeue,
    celery_retry_args,
    celery_retry_nothrow,
    echo,
)

pytestmark = pytest.mark.usefixtures("inline_worker")


def test_a_result_the_record_cannot_hold_fails_the_job_once_instead_of_rerunning_it():
    # A datetime result: Celery's JSON serializer takes it; the record's json.dumps does not
    # Then it ends at once, failed with the reason (not left active to stall and run again)
    job = wait_state(celery_now.delay().id, "completed", "failed", timeout=10)
    assert (job["state"], job["attemptsStarted"]) == ("failed", 1), job
    assert job["failedReason"].startswith("its end could not be recorded: "), job


def test_a_chain_step_that_cannot_be_recorded_does_not_leave_its_parent_active():
    # echo is a handler(job) task: a chain passes the parent's result positionally
    result = chain(celery_add.si(1, 2), echo.s())
    parent = result.apply_async().parent
    job = wait_state(parent.id, "completed", "failed", timeout=10)
    assert (job["state"], job["attemptsStarted"]) == ("failed", 1), job
    assert "keyword arguments only" in job["failedReason"], job


def test_unrecoverable_error_fails_at_once_even_under_autoretry_for_exception():
    job = wait_state(celery_autoretry_all.delay().id, "completed", "failed", timeout=15)
    assert job["state"] == "failed"
    assert job["attemptsStarted"] == 1, job
    assert job["failedReason"] == "this input can never succeed"


def test_self_retry_with_new_args_runs_again_with_those_args():
    label = unique("args")
    job = wait_state(celery_retry_args.delay(1, label).id, "completed", "failed", timeout=15)
    assert job["state"] == "completed", job
    assert job["result"] == {"n": 2, "label": label}


def test_self_retry_without_throw_still_retries_and_discards_the_runs_return():
    # Celery sends the retry and lets the run go on; Keel records the run's end as the retry
    job = wait_state(celery_retry_nothrow.delay(2).id, "completed", "failed", timeout=15)
    assert job["state"] == "completed", job
    assert job["result"] == {"retries": 2}
    assert (job["attemptsMade"], job["attemptsStarted"]) == (2, 3), job


def test_a_message_that_always_requeues_itself_ends_failed_after_its_retries():
    # Reject(requeue=True) runs again at once, as in Celery; max_retries=2 bounds it
    job = wait_state(celery_requeue.delay().id, "completed", "failed", timeout=15)
    assert job["state"] == "failed", job
    assert (job["attemptsMade"], job["attemptsStarted"]) == (3, 3), job
    assert job["failedReason"] == "not now", job


def test_a_chain_step_keeps_its_own_countdown():
    result = chain(celery_add.si(1, 1), celery_add.si(2, 2).set(countdown=2)).apply_async()
    child = wait_state(result.id, "completed", "failed", timeout=20)
    waited = (ts(child["processedOn"]) - ts(child["createdAt"])).total_seconds()
    assert waited >= 1.9, child


def test_cancelling_a_chord_part_fails_the_body_instead_of_leaving_it_waiting():
    later = unique("part")
    parts = [celery_add.si(1, 1), celery_add.si(2, 2).set(countdown=30, task_id=later)]
    body = chord(parts)(celery_collect.s())
    assert record(later)["state"] == "delayed"
    cancel(later, None)
    job = wait_state(body.id, "completed", "failed", "cancelled", timeout=10)
    assert job["state"] == "failed", job


def test_a_chord_part_that_stalled_too_often_fails_the_body():
    stuck = unique("part")
    parts = [celery_add.si(1, 1), celery_add.si(2, 2).set(countdown=30, task_id=stuck)]
    body = chord(parts)(celery_collect.s())
    with transaction() as session:  # its worker died mid-run, as often as allowed
        session.execute(
            text(
                "UPDATE jobs SET state = 'active', stalled_count = 5, lock_token = 'gone', "
                "locked_until = now() - interval '1 minute', "
                "runs = '[{\"attempt\": 1}]'::jsonb WHERE id = :id"
            ),
            {"id": stuck},
        )
    # The worker's own maintenance pass may hold the row at this moment (SKIP LOCKED):
    # either sweep ends it, so wait for the one that does
    requeue_stalled_once()
    part = wait_state(stuck, "failed", "waiting", "completed", timeout=10)
    assert part["state"] == "failed", part
    job = wait_state(body.id, "completed", "failed", timeout=10)
    assert job["state"] == "failed", job


def test_a_chord_whose_part_is_deduplicated_onto_another_job_still_ends():
    # Two parts deduplicated onto one job: the chord counts the part ids Celery froze, and
    # the second never gets a record of its own. It stands for the job that absorbed it.
    # The first waits a second before it may run: a simple-mode id is free again once its
    # job completes, and a worker that finished the first before the second was sent
    # would rightly run the second as a job of its own.
    dedup = {"deduplication": {"id": unique("dd")}}
    parts = [
        celery_add.si(1, 1).set(job_options=dedup, countdown=1),
        celery_add.si(2, 2).set(job_options=dedup),
    ]
    body = chord(parts)(celery_collect.s())
    job = wait_state(body.id, "completed", "failed", timeout=15)
    assert job["state"] == "completed", job
    assert job["result"] == {"results": [2, 2], "total": 4}


def test_a_chord_whose_part_reuses_a_finished_task_id_still_ends():
    done = celery_add.delay(1, 1).id
    wait_state(done, "completed")
    body = chord([celery_add.si(5, 5).set(task_id=done), celery_add.si(2, 2)])(celery_collect.s())
    job = wait_state(body.id, "completed", "failed", timeout=15)
    assert job["state"] == "completed", job
    # The named job is not run again: its recorded result is the part's
    assert job["result"] == {"results": [2, 4], "total": 6}
    assert record(done)["attemptsStarted"] == 1


def test_a_chord_whose_part_names_a_failed_job_fails_with_its_reason():
    failed = celery_autoretry_all.delay().id
    wait_state(failed, "failed")
    body = chord([celery_add.si(1, 1), celery_add.si(2, 2).set(task_id=failed)])(celery_collect.s())
    job = wait_state(body.id, "completed", "failed", timeout=15)
    assert job["state"] == "failed", job
    assert job["failedReason"] == (f"chord part {failed} failed: this input can never succeed"), job


def test_a_chord_part_naming_another_tenants_job_never_reads_its_result():
    from tasks.jobs import Owner, acting_as

    with acting_as(Owner("acme", unique("u"))):
        theirs = celery_add.delay(40, 2).id
    wait_state(theirs, "completed")
    with acting_as(Owner("globex", unique("u"))):
        body = chord([celery_add.si(1, 1).set(task_id=theirs)])(celery_collect.s())
    job = wait_state(body.id, "completed", "failed", timeout=15)
    assert job["state"] == "failed", job
    assert job["failedReason"] == (
        f"chord part {theirs} stands for job {theirs}, which is not found"
    ), job
    assert job["result"] is None


def owner_of(job_id: str) -> str | None:
    with transaction() as session:
        return session.execute(
            text("SELECT tenant_id FROM jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()


def test_a_tenants_chain_fanning_out_to_a_group_keeps_the_tenant():
    from celery import group

    from tasks.jobs import Owner, acting_as

    first, second = unique("g"), unique("g")
    fan_out = group(celery_add.si(2, 2).set(task_id=first), celery_add.si(3, 3).set(task_id=second))
    with acting_as(Owner("acme", unique("u"))):
        parent = chain(celery_add.si(1, 1), fan_out).apply_async().parent
    assert owner_of(wait_state(parent.id, "completed")["jobId"]) == "acme"
    wait_state(first, "completed", timeout=10)
    assert owner_of(first) == "acme"


def test_a_chain_step_with_an_eta_can_be_sent():
    from datetime import UTC, datetime, timedelta

    due = datetime.now(UTC) + timedelta(seconds=1)
    result = chain(celery_add.si(1, 1), celery_add.si(2, 2).set(eta=due)).apply_async()
    child = wait_state(result.id, "completed", "failed", timeout=20)
    assert child["state"] == "completed"
    assert ts(child["processedOn"]) >= due - timedelta(milliseconds=50), child


def test_a_message_without_a_record_held_by_its_queues_limit_is_not_lost(monkeypatch):
    from tasks.celery import app
    from tasks.jobs.run import limits

    # Given the default queue capped at one run at a time, and its slot taken
    monkeypatch.setattr(limits, "configured", lambda: {"default": limits.QueueLimit(concurrency=1)})
    held = limits.admit("default")
    try:
        # When a message arrives without a record (sent by name, as another app would)
        task_id = unique("foreign")
        app.send_task("test.celery_add", args=(20, 22), task_id=task_id, queue="default")
        # Then the held delivery leaves a record behind, run once the slot is free
        wait_state(task_id, "waiting", "delayed", "active", "completed", timeout=10)
    finally:
        limits.release(held)
    job = wait_state(task_id, "completed", "failed", timeout=20)
    assert job["result"] == 42


def test_an_immutable_chord_body_gets_no_results():
    # Celery: a body made with .si() is called with its own arguments only
    body = chord([celery_add.si(1, 1), celery_add.si(2, 2)])(celery_add.si(5, 6))
    job = wait_state(body.id, "completed", "failed", timeout=15)
    assert (job["state"], job["result"]) == ("completed", 11), job


def test_a_message_without_a_record_its_handler_cannot_take_fails_visibly():
    from tasks.celery import app

    # test.echo is a handler(job) task: data by name only; this message has positional args
    task_id = unique("foreign")
    app.send_task("test.echo", args=(1, 2), task_id=task_id, queue="default")
    job = wait_state(task_id, "completed", "failed", timeout=10)
    assert job["state"] == "failed", job
    assert "keyword arguments only" in job["failedReason"]


ROUTED = """
from celery import shared_task

from tasks.celery import app

from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs import KeelTask
from tasks.jobs.model import registry

app.conf.task_routes = {"routedtest.*": {"queue": "routed-q"}}


@shared_task(base=KeelTask, name="routedtest.noop")
def noop():
    return 1


load_job_modules()
print(app.tasks["routedtest.noop"].job_queue(), registry.get("routedtest.noop").queue)
"""


def test_a_task_routed_by_task_routes_is_declared_on_its_routed_queue():
    import os
    import subprocess
    import sys

    from tests.support.stack import PROJECT_ROOT

    # An app configured with task_routes (as a Celery project is, before its tasks load)
    done = subprocess.run(
        [sys.executable, "-c", ROUTED],
        cwd=PROJECT_ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["routed-q", "routed-q"]
