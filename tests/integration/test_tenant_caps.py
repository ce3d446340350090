"""A tenant's running jobs are capped across workers: one tenant's burst of long jobs never
holds every slot, of a queue or of all, and the tenants together leave the system's jobs a
slot (``tasks.jobs.run.tenant_caps``). Real workers, real Postgres and Redis; what ran when
is read from the jobs' records. Pure rules: ``tests/unit/test_tenant_cap_rules.py``."""

from __future__ import annotations

import time

import pytest

from tasks.jobs import Owner, add
from tasks.jobs.run import capacity, tenant_caps
from tasks.jobs.upkeep import liveness
from tests.support.client import record, ts, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for
from tests.support.timeline import max_overlap, run_intervals

pytestmark = pytest.mark.stack  # starts workers of its own

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


def started_after_add_s(job: dict) -> float:
    return (ts(job["processedOn"]) - ts(job["createdAt"])).total_seconds()


def live_holders(keys: list[str]) -> int:
    """The slots of ``keys`` whose lease has not lapsed, on Redis's clock."""
    client = liveness.quick_client()
    seconds, micros = client.time()
    now_us = seconds * 1_000_000 + micros
    return sum(client.zcount(key, f"({now_us}", "+inf") for key in keys)


def workers_known(queue: str, slots: int, total: int) -> capacity.Slots:
    """Wait until the heartbeats say ``queue`` has ``slots`` and all have ``total`` or more."""

    def seen() -> capacity.Slots | None:
        live = capacity.live(liveness.quick_client())
        return live if live.of(queue) == slots and live.total >= total else None

    found: capacity.Slots = wait_for(seen, timeout=30)
    return found


def test_a_killed_workers_tenant_slots_free_themselves_within_the_lock_duration(stack):
    # Given a worker (3 s leases) running tenant A's two capped jobs, two more in line
    lock_s = 3.0
    # (a slot reserved for the system: the tenants' shares are leased too)
    reserving = {
        "KEEL_TENANT_QUOTAS": '{"maxRunning": 2, "maxRunningPerQueue": 2, "systemReserve": 1}'
    }
    env = {**reserving, "KEEL_LOCK_DURATION_S": str(int(lock_s))}
    queue = unique("capped-kill")
    victim = WorkerProcess(stack.home, unique("victim"), concurrency=4, queues=queue, extra_env=env)
    heir = WorkerProcess(stack.home, unique("heir"), concurrency=4, queues=queue, extra_env=env)
    owner = Owner(unique("tenant"), "u")
    slots = [
        tenant_caps.names(owner.tenant_id).concurrency[0],
        tenant_caps.names(owner.tenant_id, queue).concurrency[0],
        tenant_caps.share_key(queue),
    ]
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
        # (the running jobs hold their tenant's slots, on the queue and in all, and the share's)
        assert live_holders(slots) == 3 * 2
        # When the worker is SIGKILLed while A holds its cap
        killed_at = time.monotonic()
        victim.kill()
        # Then no slot of theirs outlives its lease: the last renewal came before the kill,
        # so within KEEL_LOCK_DURATION_S of it (a second more for the polling)
        wait_for(lambda: live_holders(slots) == 0, timeout=lock_s + 10, interval=0.1)
        freed_after_s = time.monotonic() - killed_at
        assert freed_after_s <= lock_s + 1.0, freed_after_s
        # And once another worker takes the queue, the waiting jobs run, once
        heir.start()
        done = [wait_state(job_id, "completed", timeout=30) for job_id in waiting]
    finally:
        victim.kill()
        heir.stop()
    assert {(job["attemptsStarted"], job["attemptsMade"]) for job in done} == {(1, 0)}


def test_a_tenant_holds_at_most_its_share_of_a_queues_workers(stack):
    # Given a worker of 3 on one queue and a worker of 3 on another, and a cap per queue of
    # 2: a tenant may run 3 jobs in all (half of the 6 slots), but on the first queue only 2
    reports, other = unique("capped-q"), unique("capped-other")
    per_queue = {"KEEL_TENANT_QUOTAS": '{"maxRunningPerQueue": 2}'}
    on_reports = WorkerProcess(
        stack.home, unique("capr"), concurrency=3, queues=reports, extra_env=per_queue
    )
    on_other = WorkerProcess(
        stack.home, unique("capo"), concurrency=3, queues=other, extra_env=per_queue
    )
    on_reports.start()
    on_other.start()
    try:
        # (each heartbeat says which queues its slots take)
        workers_known(reports, slots=3, total=6)
        # When tenant A adds 4 jobs of 2 s on the first queue, then tenant B one
        burst = [
            add("test.sleep", {"ms": 2000}, queue=reports, owner=Owner("tenant-a", "u")).job_id
            for _ in range(4)
        ]
        wait_for(lambda: record(burst[0])["state"] == "active", timeout=30)
        other_job = add(
            "test.sleep", {"ms": 200}, queue=reports, owner=Owner("tenant-b", "u")
        ).job_id
        b_job = wait_state(other_job, "completed", timeout=30)
        a_jobs = finished(burst, timeout=60)
    finally:
        on_reports.stop()
        on_other.stop()
    # Then A never ran more than 2 at once there, and none of its waits used an attempt
    assert max_overlap(run_intervals(a_jobs)) == 2
    assert {(job["attemptsStarted"], job["attemptsMade"]) for job in a_jobs} == {(1, 0)}
    # And B's job started at once, on the slot A could not take
    assert started_after_add_s(b_job) < 2, b_job


def test_busy_tenants_leave_a_slot_for_the_systems_jobs(stack):
    # Given one worker of 3 keeping a slot for the system's jobs, and three tenants each
    # running jobs of 8 s (each capped at 1: half of the 2 slots not reserved)
    queue = unique("capped-sys")
    reserving = {"KEEL_TENANT_QUOTAS": '{"systemReserve": 1}'}
    worker = WorkerProcess(
        stack.home, unique("capsys"), concurrency=3, queues=queue, extra_env=reserving
    )
    worker.start()
    try:
        workers_known(queue, slots=3, total=3)
        owners = [Owner(unique("tenant"), "u") for _ in range(3)]
        tenants = [
            add("test.sleep", {"ms": 8000}, queue=queue, owner=owner).job_id
            for owner in owners
            for _ in range(2)
        ]
        wait_for(lambda: sum(record(j)["state"] == "active" for j in tenants) == 2, timeout=30)
        # When a system job (no tenant) is added while they are busy
        system = add("test.sleep", {"ms": 100}, queue=queue).job_id
        system_job = wait_state(system, "completed", timeout=30)
        tenant_jobs = finished(tenants, timeout=120)
    finally:
        worker.stop()
    # Then it started at once, long before any tenant's job ended
    assert started_after_add_s(system_job) < 4, system_job
    # And the tenants together never ran more than the 2 slots not reserved, each job once
    assert max_overlap(run_intervals(tenant_jobs)) == 2
    assert {(job["state"], job["attemptsMade"]) for job in tenant_jobs} == {("completed", 0)}


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
