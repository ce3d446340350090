"""Celery's ways in — ``.delay()``, ``apply_async``, ``self.retry``, ``autoretry_for``,
canvas — all go through the record, against a real ``celery worker`` process."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
from datetime import datetime

import pytest
import redis
from celery import chain, chord
from sqlalchemy import text

from tasks.celery import app
from tasks.jobs import Owner, acting_as
from tasks.platform.db import transaction
from tasks.reports.jobs import generate_report
from tests.support.client import record, unique, wait_state, waits_between_runs
from tests.support.early import published_before_commit
from tests.support.jobs import (
    celery_add,
    celery_autoretry,
    celery_collect,
    celery_part,
    celery_reject,
    celery_retry,
    celery_spawn,
    celery_spawn_later,
)
from tests.support.stack import WorkerProcess, wait_for

pytestmark = [pytest.mark.stack, pytest.mark.usefixtures("worker")]


def moment(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def messages_mentioning(job_id: str) -> int:
    """Messages in the broker (queued or reserved by a worker) that carry ``job_id``."""
    client = redis.Redis.from_url(os.environ["KEEL_REDIS_URL"])
    found = 0
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"list":
            found += sum(job_id.encode() in item for item in client.lrange(key, 0, -1))
        elif kind == b"hash" and key == b"unacked":
            found += sum(job_id.encode() in item for item in client.hvals(key))
    return found


def count_jobs(name: str, label: str) -> int:
    with transaction() as session:
        return session.execute(
            text(
                "SELECT count(*) FROM jobs WHERE name = :name "
                "AND data::text LIKE '%' || :label || '%'"
            ),
            {"name": name, "label": label},
        ).scalar_one()


def test_delay_records_the_job_and_the_worker_runs_it():
    # Given a Celery-style Keel task, When it is sent with .delay()
    result = celery_add.delay(2, 3)
    # Then its record exists as soon as delay() returns, and it completes
    assert record(result.id) is not None
    job = wait_state(result.id, "completed", "failed")
    assert job["state"] == "completed"
    assert job["result"] == 5
    assert (job["attemptsMade"], job["attemptsStarted"]) == (0, 1)


def test_a_shared_task_sent_from_a_request_thread_lands_on_its_queue():
    """A web server's request thread never set Celery's current app: a ``@shared_task``
    sent there is Keel's all the same (its queue, not Celery's fallback "celery")."""
    sent: list = []
    thread = threading.Thread(target=lambda: sent.append(celery_add.delay(20, 3)))
    thread.start()
    thread.join(timeout=10)
    assert sent and sent[0].get(timeout=20) == 23
    assert record(sent[0].id)["queue"] == celery_add.job_queue() != "celery"


def test_report_delay_and_countdown_are_records_and_the_countdown_is_durable():
    owner = Owner("acme", unique("u"))
    # When report.generate is sent the Celery way, once now and once with a countdown
    with acting_as(owner):
        now = generate_report.delay(reportId=unique(), rows=5)
        later = generate_report.apply_async(kwargs={"reportId": unique(), "rows": 5}, countdown=2)
    # Then both are records owned by the sender; the delayed one waits in Postgres,
    # with no message in the broker (nothing held in a worker's memory)
    delayed = record(later.id)
    assert delayed is not None and delayed["state"] == "delayed"
    assert messages_mentioning(later.id) == 0
    first = wait_state(now.id, "completed", "failed")
    assert first["state"] == "completed" and first["result"]["generatedRows"] == 5
    done = wait_state(later.id, "completed", "failed", timeout=30)
    assert done["state"] == "completed"
    waited = (moment(done["processedOn"]) - moment(done["createdAt"])).total_seconds()
    assert waited >= 1.95, done


def test_a_delay_inside_a_tenants_job_makes_a_job_of_that_tenant():
    # Given a job of acme's user, whose task sends another with .delay() as it runs
    owner = Owner("acme", unique("u"))
    with acting_as(owner):
        parent = celery_spawn.delay(41)
    done = wait_state(parent.id, "completed", "failed")
    assert done["state"] == "completed", done
    # Then the job it sent is the same tenant's and user's (their view, their place in the
    # queue's fair order), as its chain steps and links are: not a system job
    child_id = done["result"]["child"]
    with transaction() as session:
        row = session.execute(
            text("SELECT tenant_id, user_id FROM jobs WHERE id = :id"), {"id": child_id}
        ).one()
    assert (row.tenant_id, row.user_id) == ("acme", owner.user_id)
    assert wait_state(child_id, "completed", "failed")["result"] == 42


def test_what_a_tenant_job_sends_is_not_checked_against_its_quota_again(stack):
    # Given a worker whose tenants may delay a job by 2 s at most
    queue = unique("quota")
    env = {"KEEL_TENANT_QUOTAS": json.dumps({"maxDelaySeconds": 2})}
    worker = WorkerProcess(stack.home, unique("quota"), queues=queue, extra_env=env)
    worker.start()
    try:
        # When a tenant's job sends one with a 30 s countdown as it runs
        with acting_as(Owner("acme", unique("u"))):
            parent = celery_spawn_later.apply_async(args=(41, 30), queue=queue)
        done = wait_state(parent.id, "completed", "failed")
        # Then it is recorded, as the job's chain steps are: part of work already admitted
        assert done["state"] == "completed", done
        child = record(done["result"]["child"])
        assert child is not None and child["state"] == "delayed", child
        # While a send under the handler's own acting_as is checked against that owner's
        # quota: refused, and the job fails saying why
        with acting_as(Owner("acme", unique("u"))):
            refused = celery_spawn_later.apply_async(args=(41, 30, "acme"), queue=queue)
        failed = wait_state(refused.id, "completed", "failed")
        assert failed["state"] == "failed", failed
        assert "delayed at most 2 s" in (failed["failedReason"] or ""), failed
    finally:
        worker.stop()


def test_a_delay_inside_a_system_job_makes_a_system_job():
    done = wait_state(celery_spawn.delay(1).id, "completed", "failed")
    with transaction() as session:
        tenant = session.execute(
            text("SELECT tenant_id FROM jobs WHERE id = :id"), {"id": done["result"]["child"]}
        ).scalar_one()
    assert tenant is None


def test_self_retry_goes_through_the_record_and_request_retries_is_attempts_made():
    label = unique("retry")
    result = celery_retry.delay(2, label)
    job = wait_state(result.id, "completed", "failed", timeout=30)
    assert job["state"] == "completed", job
    assert job["result"] == {"retries": 2, "label": label}
    assert (job["attemptsMade"], job["attemptsStarted"]) == (2, 3)
    assert all(wait >= 0.25 for wait in waits_between_runs(job)), job["runs"]


def test_self_retry_past_max_retries_fails_with_the_original_error():
    result = celery_retry.delay(5)  # max_retries=2: three runs, then the failure stands
    job = wait_state(result.id, "completed", "failed", timeout=30)
    assert job["state"] == "failed"
    assert (job["attemptsMade"], job["attemptsStarted"]) == (3, 3)
    assert job["failedReason"] == "run 3"


def test_autoretry_with_backoff_waits_grow_exponentially():
    # retry_backoff=True, retry_jitter=False: Celery's countdowns 1 s, then 2 s
    result = celery_autoretry.delay(2)
    job = wait_state(result.id, "completed", "failed", timeout=30)
    assert job["state"] == "completed", job
    assert (job["attemptsMade"], job["attemptsStarted"]) == (2, 3)
    first, second = waits_between_runs(job)
    assert 0.9 <= first <= 2.0, job["runs"]
    assert 1.9 <= second <= 3.5, job["runs"]


def test_autoretry_stops_at_max_retries_and_skips_dont_autoretry_for():
    exhausted = celery_autoretry.apply_async(args=(9,))
    not_retried = celery_autoretry.apply_async(args=(0,), kwargs={"missing": True})
    job = wait_state(exhausted.id, "completed", "failed", timeout=40)
    assert job["state"] == "failed"
    assert job["attemptsStarted"] == 4  # max_retries=3: the first run and three retries
    assert job["failedReason"] == "flaky run 4"
    other = wait_state(not_retried.id, "completed", "failed")
    assert other["state"] == "failed" and other["attemptsStarted"] == 1
    assert other["failedReason"] == "no such input"


def test_a_job_not_started_before_it_expires_fails_as_expired_without_running():
    # countdown 1.5 s, expires after 0.5 s: it cannot start in time
    result = celery_add.apply_async(args=(1, 1), countdown=1.5, expires=0.5)
    job = wait_state(result.id, "completed", "failed", timeout=30)
    assert job["state"] == "failed"
    assert job["failedReason"].startswith("expired at ")
    assert job["result"] is None


def test_reject_without_requeue_fails_at_once():
    job = wait_state(celery_reject.delay().id, "completed", "failed")
    assert job["state"] == "failed"
    assert job["attemptsStarted"] == 1
    assert job["failedReason"] == "this input can never succeed"


def test_a_message_sent_without_keel_is_recorded_on_arrival():
    # Given a message sent by name, as another Celery app would (no record, no Keel header)
    task_id = unique("foreign")
    app.send_task("test.celery_add", args=(20, 22), task_id=task_id, queue="default")
    # Then the worker records it and runs it: nothing is silently dropped
    job = wait_state(task_id, "completed", "failed")
    assert job["state"] == "completed" and job["result"] == 42


def test_a_job_delivered_before_its_record_commits_runs_once_it_commits():
    # Given a job recorded and published inside a transaction that then stays open, as a
    # chain's next step is inside its parent's completing transaction (tasks.jobs.end.canvas)
    job_id = published_before_commit(
        "test.celery_add", "default", {"args": [20, 22], "kwargs": {}}, hold_s=1.5
    )
    # Then the delivery waited for the commit and ran the job: it was not dropped for the
    # reconciler to republish, which happens only after its grace period (10 s)
    done = wait_state(job_id, "completed", "failed", timeout=8)
    assert done["state"] == "completed" and done["result"] == 42, done
    assert done["attemptsStarted"] == 1


def test_a_chain_survives_a_retried_parent_and_its_child_runs_once():
    label = unique("chain")
    # A fails once (self.retry through the delayed set), then B gets A's result
    result = chain(celery_retry.si(1, label), celery_collect.s()).apply_async()
    body = wait_state(result.id, "completed", "failed", timeout=30)
    assert body["state"] == "completed", body
    assert body["result"]["results"] == {"retries": 1, "label": label}
    assert body["attemptsStarted"] == 1
    assert count_jobs("test.celery_collect", label) == 1
    assert count_jobs("test.celery_retry", label) == 1


def test_a_chord_with_retrying_parts_runs_its_body_once():
    label = unique("chord")
    parts = [celery_retry.si(1 if i < 3 else 0, f"{label}-{i}") for i in range(10)]
    result = chord(parts)(celery_collect.s())
    # The body is a record from the start, waiting for its parts (counted in Postgres)
    waiting = record(result.id)
    assert waiting is not None and waiting["state"] in ("waiting-children", "waiting", "active")
    body = wait_state(result.id, "completed", "failed", timeout=40)
    assert body["state"] == "completed", body
    assert [r["label"] for r in body["result"]["results"]] == [f"{label}-{i}" for i in range(10)]
    assert count_jobs("test.celery_collect", label) == 1


def test_a_chord_body_runs_once_when_a_worker_is_killed_mid_chord(stack):
    # Given two workers of their own on a queue of their own, with short job locks
    queue, label = "chordkill", unique("kill")
    env = {"KEEL_LOCK_DURATION_S": "3"}
    victim = WorkerProcess(stack.home, "chord-victim", concurrency=2, queues=queue, extra_env=env)
    other = WorkerProcess(stack.home, "chord-other", concurrency=2, queues=queue, extra_env=env)
    victim.start()
    other.start()
    try:
        # When a chord of 10 parts (3 retrying once, every part napping) runs on them
        parts = [
            celery_part.si(i, label, fail_first=i in (2, 5, 8), ms=700).set(queue=queue)
            for i in range(10)
        ]
        result = chord(parts)(celery_collect.s().set(queue=queue))
        # and one worker is SIGKILLed while it holds parts
        wait_for(lambda: runs_on("chord-victim", label), timeout=30)
        victim.kill()
        # Then the body runs once, with every part's result in order
        body = wait_state(result.id, "completed", "failed", timeout=90)
    finally:
        victim.kill()
        other.stop()
    assert body["state"] == "completed", body
    assert body["attemptsStarted"] == 1
    assert [r["index"] for r in body["result"]["results"]] == list(range(10))
    assert count_jobs("test.celery_collect", label) == 1
    assert runs_on("chord-victim", label) >= 1  # the victim had started parts when it died


def runs_on(worker: str, label: str) -> int:
    """How many runs of ``label``'s chord parts started on ``worker``."""
    with transaction() as session:
        return session.execute(
            text(
                "SELECT count(*) FROM jobs, jsonb_array_elements(runs) AS run "
                "WHERE name = 'test.celery_part' AND data::text LIKE '%' || :label || '%' "
                "AND run ->> 'worker' LIKE :worker || '@%'"
            ),
            {"label": label, "worker": worker},
        ).scalar_one()


USER_MODULE = '''
"""A user's own jobs, outside Keel's tree: plain Celery tasks on Keel's app (no ``base=``)."""
from tasks.celery import app


@app.task(bind=True, name="userjobs.flaky", queue="userjobs",
          autoretry_for=(IOError,), retry_backoff=True, retry_jitter=False, max_retries=3)
def flaky(self, key, fail_times):
    if self.request.retries < fail_times:
        raise IOError(f"{key}: flaky run {self.request.retries + 1}")
    return {"key": key, "retries": self.request.retries}
'''


@pytest.fixture(scope="module")
def user_module(stack, tmp_path_factory):
    """``userjobs`` in a directory of its own, loaded by a worker through KEEL_JOB_MODULES."""
    where = tmp_path_factory.mktemp("userjobs")
    (where / "userjobs.py").write_text(textwrap.dedent(USER_MODULE))
    sys.path.insert(0, str(where))
    process = WorkerProcess(
        stack.home,
        "userjobs",
        extra_env={"KEEL_JOB_MODULES": "userjobs", "PYTHONPATH": str(where)},
    )
    process.start()
    import userjobs  # importable only once its directory is on the path

    yield userjobs
    process.stop()
    sys.path.remove(str(where))


def test_a_user_module_runs_through_the_setting_with_its_own_queue(user_module):
    # Given a module outside Keel with a plain @app.task that autoretries, on a queue Keel
    # never heard of
    app.finalize(auto=True)
    # When it is sent with .delay() and fails twice
    result = user_module.flaky.delay("k1", 2)
    # Then its retries wait in Postgres (the record is delayed between runs), not in a worker
    assert wait_state(result.id, "delayed", timeout=20)["attemptsMade"] == 1
    # And one record, completed on run 3, waits growing exponentially
    job = wait_state(result.id, "completed", "failed", timeout=40)
    assert job["state"] == "completed", job
    assert job["queue"] == "userjobs"
    assert (job["attemptsMade"], job["attemptsStarted"]) == (2, 3)
    first, second = waits_between_runs(job)
    assert 0.9 <= first <= 2.0 and 1.9 <= second <= 3.5, job["runs"]
    assert second > first
    assert wait_for(lambda: count_jobs("userjobs.flaky", "k1") == 1 or None, timeout=5)
