"""An aborted run that does not stop by itself is stopped by its worker after the grace period.

Real ``celery worker`` processes on queues of their own, with ``KEEL_ABORT_GRACE_S=1``:
under prefork the run's pool process is killed and replaced, the job ends ``cancelled``,
its message is let go (not requeued as a lost run) and the worker goes on consuming;
under the threads pool, which cannot stop a run, the job is cancelled all the same and
what the run returns later is not recorded.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tasks.jobs import add
from tasks.jobs.end.cancel import cancel
from tests.support import jobs as test_jobs
from tests.support.client import record, unique, wait_state
from tests.support.stack import WorkerProcess

pytestmark = pytest.mark.stack

GRACE_S = 1
# The grace period, the worker's check (about every second) and a loaded machine's slack.
STOPPED_WITHIN_S = 20


def worker_on_own_queue(stack, pool: str | None) -> tuple[WorkerProcess, str]:
    queue = unique(f"abort-{pool or 'prefork'}")
    worker = WorkerProcess(
        stack.home,
        queue,
        concurrency=1,
        queues=queue,
        pool=pool,
        extra_env={"KEEL_ABORT_GRACE_S": str(GRACE_S), "KEEL_LOG_FORMAT": "text"},
    )
    worker.start()
    return worker, queue


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a killed process its parent has not reaped yet does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_run_that_does_not_stop_is_killed_after_the_grace_period_and_the_worker_goes_on(
    stack,
):
    worker, queue = worker_on_own_queue(stack, None)
    try:
        # Given a prefork run that sleeps 30 s and never checks for an abort
        result = test_jobs.nap.apply_async(
            args=(30,), queue=queue, link_error=test_jobs.note_errback.s()
        )
        running = wait_state(result.id, "active", timeout=30)
        pid = running["runs"][-1]["pid"]
        # When an operator aborts it
        asked = time.monotonic()
        assert cancel(result.id, None, actor="ops", reason="runaway").aborting
        # Then it is still active through the grace period, then cancelled: its pool
        # process killed first
        job = wait_state(result.id, "cancelled", "failed", "completed", timeout=STOPPED_WITHIN_S)
        assert time.monotonic() - asked >= GRACE_S
        assert job["state"] == "cancelled", job
        assert job["runs"][-1]["outcome"] == "cancelled", job
        assert "stopped after the 1 s grace period" in job["runs"][-1]["reason"], job
        assert not alive(pid)
        # and the worker goes on consuming, in a new pool process
        next_job = add("test.echo", {"n": 1}, queue=queue).job_id
        after = wait_state(next_job, "completed", "failed", timeout=30)
        assert after["state"] == "completed", after
        # and the killed run's message was let go, not requeued as lost (delivered once):
        # the job never ran again, and no errback was called for it
        time.sleep(2)  # (a requeued message comes back within a fraction of a second)
        job = record(result.id)
        assert (job["state"], job["attemptsStarted"], len(job["runs"])) == ("cancelled", 1, 1)
        received = f"Task test.nap[{result.id}] received"
        assert worker.log_path.read_text().count(received) == 1
        assert test_jobs.errbacks_for(result.id) == []
    finally:
        worker.stop()


def test_where_the_pool_cannot_stop_a_run_the_job_is_cancelled_and_its_late_end_ignored(stack):
    worker, queue = worker_on_own_queue(stack, "threads")
    try:
        # Given a threads-pool run that sleeps 5 s and never checks for an abort
        result = test_jobs.nap.apply_async(args=(5,), queue=queue)
        wait_state(result.id, "active", timeout=30)
        # When it is aborted
        assert cancel(result.id, None, actor="ops").aborting
        # Then after the grace period the job is cancelled, saying the run may go on
        job = wait_state(result.id, "cancelled", "completed", timeout=STOPPED_WITHIN_S)
        assert job["state"] == "cancelled", job
        assert "this pool cannot stop it" in job["runs"][-1]["reason"], job
        # and what the run returns later is not recorded; the worker runs the next job
        next_job = add("test.echo", {"n": 2}, queue=queue).job_id
        after = wait_state(next_job, "completed", "failed", timeout=30)
        assert after["state"] == "completed", after
        job = record(result.id)
        assert (job["state"], job["result"], len(job["runs"])) == ("cancelled", None, 1), job
    finally:
        worker.stop()
