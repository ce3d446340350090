"""``async def`` tasks and handlers on real workers (``tasks.jobs.run.aio``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.exceptions import TimeLimitExceeded

from tasks.jobs import Owner, acting_as
from tasks.jobs.observe import job_logs as logs_of_jobs
from tests.support import async_jobs
from tests.support.client import bearer, record, ts, unique, wait_state, waits_between_runs
from tests.support.stack import WorkerProcess

pytestmark = pytest.mark.stack  # starts worker processes of its own


def job_logs(job_id: str) -> list[dict]:
    return list(logs_of_jobs.page(job_id)["logs"])


@pytest.fixture(scope="module")
def prefork(stack):
    process = WorkerProcess(
        stack.home, "async", concurrency=2, queues="async", include="tests.support.async_jobs"
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def threads(stack):
    process = WorkerProcess(
        stack.home,
        "async-threads",
        concurrency=100,
        pool="threads",
        queues="async-threads",
        include="tests.support.async_jobs",
    )
    process.start()
    yield process
    process.stop()


def test_an_async_task_is_retried_with_backoff_then_awaits_an_http_call(prefork, sandbox):
    url = f"{sandbox.url}/health"
    result = async_jobs.async_fetch.apply_async((url, 2), queue="async")
    assert result.get(timeout=60) == {"status": 200, "retries": 2}
    job = record(result.id)
    assert (job["state"], job["attemptsMade"], job["attemptsStarted"]) == ("completed", 2, 3)
    waits = waits_between_runs(job)  # retry_backoff=1, no jitter: 1 s, then 2 s
    assert 0.9 <= waits[0] <= 6 and 1.9 <= waits[1] <= 7, waits


def test_an_async_handler_reports_progress_and_logs(prefork):
    result = async_jobs.async_handler.apply_async(kwargs={"n": 7}, queue="async")
    job = wait_state(result.id, "completed", "failed", timeout=30)
    assert (job["state"], job["result"], job["progress"]) == ("completed", {"n": 7}, 50), job


# Celery keeps time limits on prefork; on the threads pool, which ignores them, Keel does
POOLS = {"prefork": "async", "threads": "async-threads"}  # the pool's worker, by its queue


@pytest.mark.parametrize("pool", POOLS)
def test_a_soft_time_limit_cancels_an_async_task_at_its_await_and_fails_the_run(request, pool):
    request.getfixturevalue(pool)
    result = async_jobs.async_soft_limited.apply_async((30,), queue=POOLS[pool])
    job = wait_state(result.id, "completed", "failed", timeout=30)
    assert job["state"] == "failed", job
    assert job["runs"][0]["exception"]["exc_type"] == "SoftTimeLimitExceeded", job
    assert ts(job["finishedOn"]) - ts(job["processedOn"]) < timedelta(seconds=15), job
    # the coroutine saw asyncio.CancelledError at its await (its except/finally ran)
    assert "cancelled at its await" in [line["message"] for line in job_logs(result.id)]


@pytest.mark.parametrize("pool", POOLS)
def test_a_hard_time_limit_ends_an_async_run_timed_out(request, pool):
    request.getfixturevalue(pool)
    result = async_jobs.async_sleep.apply_async(
        (30,), time_limit=1, queue=POOLS[pool], job_options={"attempts": 1}
    )
    job = wait_state(result.id, "completed", "failed", timeout=30)
    assert (job["state"], job["failedReason"]) == ("failed", "timed out after 1 s"), job
    assert job["runs"][0]["exception"]["exc_type"] == "TimeLimitExceeded", job
    with pytest.raises(TimeLimitExceeded, match="timed out after 1 s"):  # Celery's view alike
        result.get(timeout=10)
    # ended at its limit, not when its 30 s sleep returned
    assert ts(job["finishedOn"]) - ts(job["processedOn"]) < timedelta(seconds=15), job


def test_an_abort_cancels_an_async_task_at_its_await_and_frees_its_slot(prefork, client):
    tenant = unique("async")
    with acting_as(Owner(tenant, "alice")):
        running = async_jobs.async_sleep.apply_async((60,), queue="async")
    wait_state(running.id, "active", timeout=30)
    # its owner cancels it through the API, as the dashboard's button does
    cancelled = client.delete(f"/api/v1/jobs/{running.id}", headers=bearer(tenant, "alice"))
    assert cancelled.status_code == 202, cancelled.get_data(as_text=True)  # abort asked
    assert cancelled.get_json()["abortRequestedAt"] is not None
    job = wait_state(running.id, "cancelled", "completed", "failed", timeout=20)
    assert job["state"] == "cancelled", job
    assert job["runs"][-1]["outcome"] == "cancelled", job
    # well before its 60 s sleep: it stopped at the await
    assert ts(job["finishedOn"]) - ts(job["processedOn"]) < timedelta(seconds=15), job
    # and the worker's slots are free again: two more run at once
    after = [async_jobs.async_sleep.apply_async((0.1,), queue="async") for _ in range(2)]
    assert [r.get(timeout=30) for r in after] == [0.1, 0.1]


def test_a_hundred_async_tasks_await_at_once_on_one_threads_worker(threads):
    # Each awaits 15 s: far longer than sending the hundred and their claims take, even on a
    # loaded machine (about 1 s idle), so the last one starts before the first one ends.
    sent = [async_jobs.async_sleep.apply_async((15,), queue="async-threads") for _ in range(100)]
    jobs = [wait_state(r.id, "completed", "failed", timeout=180) for r in sent]
    unfinished = [job for job in jobs if job["state"] != "completed"]
    assert unfinished == [], unfinished[:2]
    # one worker process ran them all
    assert len({(j["runs"][-1]["worker"], j["runs"][-1]["pid"]) for j in jobs}) == 1, jobs[:2]
    spans = [(ts(j["processedOn"]), ts(j["finishedOn"])) for j in jobs]
    # The most runs under way at one moment (a run's start): all hundred
    overlap = max(sum(start <= s < end for start, end in spans) for s, _ in spans)
    assert overlap == 100, overlap
