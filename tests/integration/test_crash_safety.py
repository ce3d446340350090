"""Results stay single when workers die or race (idempotency is not dedup)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select

from tasks.jobs import Owner
from tasks.jobs.intake.enqueue import add
from tasks.platform.db import transaction
from tasks.reports import artifacts
from tasks.reports.jobs import GENERATE
from tasks.reports.models import ReportArtifact
from tasks.reports.operation_key import operation_key
from tasks.reports.service import report_options
from tests.support.client import unique, wait_state
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.stack  # starts processes of its own


def artifact_rows(key: str) -> int:
    with transaction() as session:
        return session.scalar(select(func.count()).where(ReportArtifact.operation_key == key))


def test_sigkill_after_storing_reruns_and_reuses_the_artifact(stack, worker):
    # Given a worker that will be SIGKILLed right after storing the artifact
    queue = unique("crashlab")
    victim = WorkerProcess(
        stack.home, unique("victim"), concurrency=1, extra_env={"KEEL_LOCK_DURATION_S": "2"}
    )
    victim.queues = queue
    victim.start()
    report_id = unique()
    key = operation_key("acme", "alice", report_id, 3)
    data = {"reportId": report_id, "rows": 3, "crashAfterStoreOnRun": 1}
    added = add(GENERATE, data, queue=queue, opts=report_options(key), owner=Owner("acme", "alice"))
    # When it dies before recording completion
    wait_for(lambda: victim.process.poll() is not None, timeout=30)
    assert artifact_rows(key) == 1
    assert wait_state(added.job_id, "active")["attemptsStarted"] == 1
    # Then the stall is detected and another worker runs it again, reusing the artifact
    rescuer = WorkerProcess(stack.home, unique("rescuer"), concurrency=1)
    rescuer.queues = queue
    rescuer.start()
    try:
        job = wait_state(added.job_id, "completed", timeout=30)
    finally:
        rescuer.stop()
    assert job["result"]["reused"] is True
    assert job["attemptsStarted"] == 2 and job["stalledCount"] == 1
    assert artifact_rows(key) == 1


def test_racing_writers_store_one_artifact_and_agree_on_it(stack):
    key = operation_key("acme", "alice", unique(), 12)
    barrier = threading.Barrier(8)
    results: list[dict] = []

    def write(n: int) -> None:
        barrier.wait()
        with transaction() as session:
            stored, _ = artifacts.save_once(
                session,
                ReportArtifact(
                    operation_key=key,
                    tenant_id="acme",
                    report_id="race",
                    object_key=f"reports/acme/{key}.csv",
                    generated_rows=12,
                    job_id=f"job-{n}",
                ),
            )
            results.append(artifacts.as_result(stored, reused=stored.job_id != f"job-{n}"))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert artifact_rows(key) == 1
    assert len({r["objectKey"] for r in results}) == 1
    assert sorted(r["reused"] for r in results) == [False] + [True] * 7
