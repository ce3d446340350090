"""A tenant's running jobs are capped across workers: one tenant's burst of long jobs never
holds every slot (``tasks.jobs.run.tenant_caps``). Real workers, real Postgres and Redis;
what ran when is read from the jobs' records."""

from __future__ import annotations

import pytest

from tasks.jobs import Owner, add
from tasks.jobs.run import capacity, tenant_caps
from tasks.jobs.upkeep import liveness
from tests.support.client import record, ts, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for
from tests.support.timeline import max_overlap, run_intervals

CAPPED = {"KEEL_TENANT_QUOTAS": '{"maxRunning": 2}'}


def finished(job_ids: list[str], timeout: float) -> list[dict]:
    return [wait_state(job_id, "completed", "failed", timeout=timeout) for job_id in job_ids]


def test_a_tenants_burst_holds_its_cap_and_another_tenant_starts_at_once(stack):
    # Given one worker of concurrency 4, tenants capped at 2 running jobs each
    queue = unique("capped")
    worker = WorkerProcess(stack.home, unique("capw"), concurrency=4, queues=queue)
    worker.extra_env = CAPPED
    worker.start()
    try:
        # When tenant A adds 8 jobs of 3 s, then tenant B adds one
        burst = [
            add("test.sleep", {"ms": 3000}, queue=queue, owner=Owner("tenant-a", "u")).job_id
            for _ in range(8)
        ]
        wait_for(lambda: record(burst[0])["state"] == "active", timeout=30)
        # (the worker's heartbeat says how many slots it has: what a default cap shares)
        assert capacity.live_slots(liveness.quick_client()) >= 4
        other = add("test.sleep", {"ms": 500}, queue=queue, owner=Owner("tenant-b", "u")).job_id
        b_job = wait_state(other, "completed", timeout=30)
        a_jobs = finished(burst, timeout=90)
    finally:
        worker.stop()
    # Then B's job started within 2 s of its add, while A's burst was still running
    waited_s = (ts(b_job["processedOn"]) - ts(b_job["createdAt"])).total_seconds()
    assert waited_s < 2, waited_s
    # And A never ran more than its cap at once, every job completed, each run once: its
    # waits for a slot cost no attempt
    assert {job["state"] for job in a_jobs} == {"completed"}
    assert max_overlap(run_intervals(a_jobs)) == 2
    assert {(job["attemptsStarted"], job["attemptsMade"]) for job in a_jobs} == {(1, 0)}


def test_a_killed_workers_tenant_slots_free_themselves(stack):
    # Given a worker (3 s leases) running tenant A's two capped jobs, two more in line
    env = {**CAPPED, "KEEL_LOCK_DURATION_S": "3"}
    queue = unique("capped-kill")
    victim = WorkerProcess(stack.home, unique("victim"), concurrency=4, queues=queue, extra_env=env)
    heir = WorkerProcess(stack.home, unique("heir"), concurrency=4, queues=queue, extra_env=env)
    owner = Owner(unique("tenant"), "u")
    victim.start()
    try:
        running = [
            add("test.sleep", {"ms": 20_000}, queue=queue, owner=owner).job_id for _ in range(2)
        ]
        for job_id in running:
            wait_state(job_id, "active", timeout=30)
        waiting = [add("test.sleep", {"ms": 0}, queue=queue, owner=owner).job_id for _ in range(2)]
        for job_id in waiting:
            wait_for(lambda job_id=job_id: record(job_id)["state"] == "delayed", timeout=15)
        # When the worker is SIGKILLed while A holds its cap, and another takes the queue
        victim.kill()
        heir.start()
        # Then the dead runs' slots lapse with their leases: the waiting jobs run, once
        done = [wait_state(job_id, "completed", timeout=30) for job_id in waiting]
    finally:
        victim.kill()
        heir.stop()
    assert {(job["attemptsStarted"], job["attemptsMade"]) for job in done} == {(1, 0)}


def test_the_default_cap_is_half_the_live_workers_slots(stack, monkeypatch):
    # Given no configured cap
    monkeypatch.setattr(tenant_caps, "_slots", {"count": 0.0, "read_at": float("-inf")})
    # Then the cap follows the slots the live workers' heartbeats recorded
    slots = capacity.live_slots(liveness.quick_client())
    expected = None if slots == 0 else -(-slots // 2)
    assert tenant_caps.cap() == expected
    # And the heartbeat's key and freshness are the ones capacity reads
    assert liveness.key("worker") == capacity.ALIVE_KEY
    assert capacity.FRESH_S == liveness.FRESH_S


@pytest.mark.parametrize(("slots", "cap"), [(0, None), (1, 1), (3, 2), (4, 2), (9, 5)])
def test_the_default_cap_rounds_half_up_and_none_without_workers(monkeypatch, slots, cap):
    monkeypatch.setattr(tenant_caps, "_live_slots", lambda: slots)
    assert tenant_caps.cap() == cap


@pytest.mark.slow
def test_twenty_long_jobs_of_one_tenant_leave_room_for_another(stack):
    # The figures (~4 minutes): one worker of concurrency 4, tenants capped at 2
    # (what the default gives a lone worker of 4; set, so that other live workers of the
    # session do not raise it); tenant A adds 20 jobs of 20 s, then tenant B one
    queue = unique("capped-long")
    worker = WorkerProcess(stack.home, unique("capl"), concurrency=4, queues=queue)
    worker.extra_env = CAPPED
    worker.start()
    try:
        burst = [
            add("test.sleep", {"ms": 20_000}, queue=queue, owner=Owner("tenant-a", "u")).job_id
            for _ in range(20)
        ]
        wait_for(lambda: record(burst[0])["state"] == "active", timeout=30)
        other = add("test.sleep", {"ms": 100}, queue=queue, owner=Owner("tenant-b", "u")).job_id
        b_job = wait_state(other, "completed", timeout=60)
        a_jobs = finished(burst, timeout=400)
    finally:
        worker.stop()
    waited_s = (ts(b_job["processedOn"]) - ts(b_job["createdAt"])).total_seconds()
    assert waited_s < 2, waited_s
    assert max_overlap(run_intervals(a_jobs)) == 2
    assert {(job["state"], job["attemptsMade"]) for job in a_jobs} == {("completed", 0)}
