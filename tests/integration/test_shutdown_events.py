"""A warm shutdown's last task events reach Flower: the worker flushes its batched task
events on its way out, even when their timer (``KEEL_EVENT_FLUSH_S``) has not fired."""

from __future__ import annotations

import signal

import pytest

from tests.integration.test_shutdown import SLOW_STEPS, add_reports, states
from tests.support.client import unique
from tests.support.events import celery_events
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.stack  # starts processes of its own


def test_sigterm_still_sends_the_task_succeeded_of_the_jobs_it_finishes(stack):
    # Given Flower's view of the events, and a worker running a 3 s report job, whose
    # task events would wait 30 s to leave together
    with celery_events() as heard:
        queue = unique("last-events")
        worker = WorkerProcess(
            stack.home,
            unique("last-events"),
            concurrency=1,
            queues=queue,
            extra_env={**SLOW_STEPS, "KEEL_EVENT_FLUSH_S": "30"},
        )
        worker.start()
        try:
            jobs = add_reports(queue, 1)
            wait_for(lambda: states(jobs) == ["active"], timeout=15)
            # When it is told to stop while the job runs
            assert worker.stop(signal.SIGTERM, timeout=30) == 0, worker.log_tail()
        finally:
            worker.kill()
        (job_id,) = jobs
        # Then the job it finished on its way out is seen to succeed, not left "started"
        wait_for(
            lambda: any(
                e["type"] == "task-succeeded" and e.get("uuid") == job_id for e in heard.events
            ),
            timeout=5,
        )
    assert states(jobs) == ["completed"]
