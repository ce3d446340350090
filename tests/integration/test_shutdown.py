"""Shutdown: SIGTERM finishes the active jobs and exits 0; SIGKILL's jobs run again elsewhere."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import func, select

from tasks.jobs import Owner
from tasks.jobs.intake.enqueue import add
from tasks.platform.db import transaction
from tasks.reports.jobs import GENERATE
from tasks.reports.models import ReportArtifact
from tasks.reports.operation_key import operation_key
from tasks.reports.service import report_options
from tests.support.client import record, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.stack  # starts processes of its own

# One tenant fills the worker here: its running-jobs caps (by default half the live workers'
# slots, tasks.jobs.run.tenant_caps) are lifted, or some of its jobs would wait their turn.
UNCAPPED = {
    "KEEL_TENANT_QUOTAS": '{"maxRunning": 100, "maxRunningPerQueue": 100, "systemReserve": 0}'
}
SLOW_STEPS = {
    "KEEL_REPORT_STEP_PAUSE_MS": "1000",  # a report takes 3 s: surely active at the signal
    **UNCAPPED,
}


def add_reports(queue: str, count: int) -> dict[str, str]:
    """``count`` report jobs on ``queue``: job id → operation key."""
    added = {}
    for _ in range(count):
        report_id = unique()
        key = operation_key("acme", "alice", report_id, 5)
        data = {"reportId": report_id, "rows": 5}
        job = add(
            GENERATE, data, queue=queue, opts=report_options(key), owner=Owner("acme", "alice")
        )
        added[job.job_id] = key
    return added


def states(job_ids) -> list[str]:
    return [record(job_id)["state"] for job_id in job_ids]


def artifact_rows(key: str) -> int:
    with transaction() as session:
        return session.scalar(select(func.count()).where(ReportArtifact.operation_key == key))


def test_sigterm_finishes_the_active_jobs_takes_no_new_ones_and_exits_0(stack):
    # Given a worker of concurrency 6 running 6 report jobs, with a 7th waiting behind them
    queue = unique("graceful")
    victim = WorkerProcess(
        stack.home, unique("graceful"), concurrency=6, queues=queue, extra_env=SLOW_STEPS
    )
    victim.start()
    try:
        jobs = add_reports(queue, 6)
        wait_for(lambda: states(jobs) == ["active"] * 6, timeout=15)
        behind = add_reports(queue, 1)
        # When it receives SIGTERM
        code = victim.stop(signal.SIGTERM, timeout=30)
    finally:
        victim.kill()
    # Then it finished all 6 itself, took nothing new, and exited 0
    assert code == 0, victim.log_tail()
    finished = [record(job_id) for job_id in jobs]
    assert [(j["state"], j["attemptsStarted"]) for j in finished] == [("completed", 1)] * 6
    assert all(artifact_rows(key) == 1 for key in jobs.values())
    waiting = record(next(iter(behind)))
    assert (waiting["state"], waiting["attemptsStarted"]) == ("waiting", 0)


def test_sigkill_jobs_are_completed_by_another_worker_with_one_artifact_each(stack):
    # Given a worker (3 s job locks) running 6 report jobs, and a second worker on the queue
    queue = unique("killed")
    victim = WorkerProcess(
        stack.home,
        unique("victim"),
        concurrency=6,
        queues=queue,
        extra_env={
            "KEEL_REPORT_STEP_PAUSE_MS": "3000",  # 9 s per report
            "KEEL_LOCK_DURATION_S": "3",
            **UNCAPPED,
        },
    )
    victim.start()
    rescuer = WorkerProcess(
        stack.home, unique("rescuer"), concurrency=6, queues=queue, extra_env=UNCAPPED
    )
    try:
        jobs = add_reports(queue, 6)
        wait_for(lambda: states(jobs) == ["active"] * 6, timeout=15)
        rescuer.start()
        # When the first worker is SIGKILLed mid-job
        killed_at = time.monotonic()
        victim.kill()
        # Then within the stall interval + 30 s the other worker has completed all 6
        done = [wait_state(job_id, "completed", timeout=3 + 1 + 30) for job_id in jobs]
        took = time.monotonic() - killed_at
    finally:
        victim.kill()
        rescuer.stop()
    print(f"all 6 completed {took:.1f} s after SIGKILL")
    assert took < 3 + 1 + 30
    assert {(j["attemptsStarted"], j["stalledCount"]) for j in done} == {(2, 1)}
    assert {j["runs"][-1]["worker"].split("@")[0] for j in done} == {rescuer.name}
    assert all(artifact_rows(key) == 1 for key in jobs.values())
