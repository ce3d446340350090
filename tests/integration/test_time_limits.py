"""Celery's time limits on a Keel task, with a real prefork worker."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.support import jobs as test_jobs
from tests.support.client import record, wait_state
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.usefixtures("worker")


def test_a_soft_time_limit_raises_inside_the_handler_which_ends_cleanly():
    # Given a task declared with soft_time_limit=1 that would sleep 30 s
    result = test_jobs.soft_limited.delay(30)
    # Then Celery's SoftTimeLimitExceeded reached the handler after about a second, and the
    # handler's own ending (here: a clean return) is the run's, recorded once
    job = wait_state(result.id, "completed", "failed", timeout=20)
    assert job["state"] == "completed", job
    assert job["result"]["interrupted"] is True and 0.5 <= job["result"]["after"] < 10
    assert job["attemptsStarted"] == 1 and len(job["runs"]) == 1


def test_a_call_s_own_soft_time_limit_reaches_the_handler_and_every_retry_of_it():
    # Given a task that declares no time limit, called with soft_time_limit=1, whose first
    # run asks for a retry (the retry is published again from the record)
    result = test_jobs.nap.apply_async(args=(8,), kwargs={"retry_first": True}, soft_time_limit=1)
    # Then the retried run was interrupted after about a second, not after its 8 s nap
    job = wait_state(result.id, "completed", "failed", timeout=20)
    assert job["state"] == "completed", job
    assert job["result"]["interrupted"] is True and 0.5 <= job["result"]["after"] < 6, job
    assert job["attemptsStarted"] == 2, job


def test_a_run_past_its_hard_time_limit_is_recorded_timed_out_and_retried_by_its_job_s_rules():
    # Given a job of two attempts whose handler would sleep 30 s, called with time_limit=1
    result = test_jobs.nap.apply_async(
        args=(30,),
        time_limit=1,
        job_options={"attempts": 2, "backoff": {"type": "fixed", "delay": 100}},
        link_error=test_jobs.note_errback.s(),
    )
    # Then each run was ended by the limit and recorded as a failed run that timed out, the
    # first retried by the job's rules, the second final: not left active until its lock ran
    # out, then run again as stalled
    job = wait_state(result.id, "failed", timeout=30)
    assert job["failedReason"] == "timed out after 1 s", job
    assert (job["attemptsStarted"], job["attemptsMade"], job["stalledCount"]) == (2, 2, 0), job
    assert [run["outcome"] for run in job["runs"]] == ["retrying", "failed"], job
    assert all(run["error"] == "timed out after 1 s" for run in job["runs"]), job
    assert all(run["exception"]["exc_type"] == "TimeLimitExceeded" for run in job["runs"]), job
    # and the worker replaced the pool process it killed: its next job runs
    after = wait_state(test_jobs.echo.delay(n=1).id, "completed", "failed", timeout=20)
    assert after["state"] == "completed", after
    # and the job's errback was called once, for the final failure, not at every timeout
    noted = wait_for(lambda: test_jobs.errbacks_for(result.id), timeout=10)
    time.sleep(1)  # (a second call would have been sent with the first)
    assert noted == test_jobs.errbacks_for(result.id) == [result.id]


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_where_no_pool_process_is_killed_a_run_past_its_hard_limit_is_failed_as_it_returns(
    stack, pool
):
    # Given a worker of the threads or solo pool (Celery keeps no time limits there: nothing
    # kills the run) on a queue of its own
    queue = f"{pool}-{uuid.uuid4().hex[:8]}"
    threads = WorkerProcess(stack.home, queue, concurrency=2, queues=queue, pool=pool)
    threads.start()
    try:
        # When a run with a 1 s hard limit returns after 3 s
        result = test_jobs.nap.apply_async(args=(3,), queue=queue, time_limit=1)
        job = wait_state(result.id, "completed", "failed", timeout=30)
    finally:
        threads.stop()
    # Then it is failed as timed out when it returns, saying why it ran on
    assert job["state"] == "failed", job
    assert job["failedReason"].startswith("timed out after 1 s (returned after 3."), job
    assert "this pool cannot stop a run" in job["failedReason"], job
    assert (job["attemptsStarted"], job["stalledCount"]) == (1, 0), job


def test_a_job_type_s_timeout_ends_a_run_that_hangs_and_its_backoff_runs_it_again():
    # Given a handler declared with timeout=2 (two attempts, 0.5 s apart) that sleeps 30 s
    started = time.monotonic()
    job_id = test_jobs.hang.delay().id
    # Then its first run is failed "timed out after 2 s" within seconds, not 30
    first = wait_for(lambda: _failed_runs(job_id, 1), timeout=20)
    assert time.monotonic() - started < 15, first  # 2 s, and the worker's own slack
    assert first["runs"][0]["error"] == "timed out after 2 s", first
    # and its backoff runs it again, which times out too: failed for good, never stalled
    job = wait_state(job_id, "failed", timeout=30)
    assert job["failedReason"] == "timed out after 2 s", job
    assert (job["attemptsMade"], job["stalledCount"]) == (2, 0), job
    # and the slot it held is free again: the worker runs the next job
    after = wait_state(test_jobs.echo.delay(n=2).id, "completed", "failed", timeout=20)
    assert after["state"] == "completed", after


def _failed_runs(job_id: str, count: int) -> dict | None:
    job = record(job_id)
    failed = [run for run in (job or {}).get("runs", []) if run.get("outcome") != "completed"]
    return job if len([run for run in failed if "error" in run]) >= count else None
