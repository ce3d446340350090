"""Global per-queue limits across worker processes: a concurrency cap and a rate limit."""

from __future__ import annotations

import json

import pytest

from tasks.jobs import Backoff, JobOptions, add
from tasks.platform.setting_types import parse_queue_limits as parse
from tests.support.client import record, ts, unique, wait_state
from tests.support.early import published_before_commit
from tests.support.stack import WorkerProcess, wait_for
from tests.support.timeline import ActiveSampler, max_in_window, max_overlap, run_intervals

pytestmark = pytest.mark.stack  # starts processes of its own

CAPPED = unique("capped")
RATED = unique("rated")
SINGLE = unique("single")
LIMITS = {
    CAPPED: {"concurrency": 4},
    RATED: {"rate": {"max": 10, "duration_ms": 1000}},
    SINGLE: {"concurrency": 1},
}


@pytest.fixture(scope="module")
def limited_workers(stack):
    """Two worker processes of concurrency 3 each, sharing the global limits above."""
    env = {"KEEL_QUEUE_LIMITS": json.dumps(LIMITS)}
    queues = ",".join(LIMITS)
    workers = [
        WorkerProcess(stack.home, unique(f"limits{n}"), concurrency=3, queues=queues, extra_env=env)
        for n in (1, 2)
    ]
    for worker in workers:
        worker.start()
    yield workers
    for worker in workers:
        worker.stop()


def finished(job_ids: list[str], timeout: float) -> list[dict]:
    return [wait_state(job_id, "completed", "failed", timeout=timeout) for job_id in job_ids]


def test_global_concurrency_holds_across_worker_processes(limited_workers):
    # Given a queue capped at 4 and two workers with 3 processes each
    # When 16 jobs that each take 0.4 s are added at once
    with ActiveSampler(CAPPED) as sampler:
        ids = [add("test.sleep", {"ms": 400}, queue=CAPPED).job_id for _ in range(16)]
        jobs = finished(ids, timeout=30)
    # Then never more than 4 ran at once, by the records' timelines and by sampling
    peak = max_overlap(run_intervals(jobs))
    print(f"max concurrent runs {peak}, max sampled active {max(sampler.samples)}")
    assert peak == 4, peak
    assert max(sampler.samples) <= 4
    # And being held cost no attempt: every job ran once and completed
    assert all(j["state"] == "completed" for j in jobs)
    assert {(j["attemptsMade"], j["attemptsStarted"], len(j["runs"])) for j in jobs} == {(0, 1, 1)}


def test_global_rate_limit_holds_across_worker_processes(limited_workers):
    # Given a queue limited to 10 starts per second, and two workers
    # When 210 jobs are added at once
    ids = [add("test.echo", {"n": n}, queue=RATED).job_id for n in range(210)]
    jobs = finished(ids, timeout=40)
    # Then no 1 s window held more than 10 starts, and the 210 starts took at least 20 s
    starts = [ts(run["startedAt"]) for job in jobs for run in job["runs"]]
    busiest = max_in_window(starts, 1.0)
    span = (max(starts) - min(starts)).total_seconds()
    print(f"max starts in any 1 s window {busiest}, 210 starts over {span:.1f} s")
    assert busiest <= 10
    assert span >= 20
    assert {(j["state"], j["attemptsMade"], j["attemptsStarted"]) for j in jobs} == {
        ("completed", 0, 1)
    }


def test_a_slot_is_given_back_on_every_way_a_run_ends(limited_workers):
    # Given a queue with a single global slot (its lease would last 30 s)
    retried = JobOptions(attempts=2, backoff=Backoff(type="fixed", delay=100))
    failing = add("test.always_fails", {}, queue=SINGLE, opts=retried).job_id
    unrecoverable = add("test.unrecoverable", {}, queue=SINGLE).job_id
    echoes = [add("test.echo", {"n": n}, queue=SINGLE).job_id for n in range(3)]
    # When runs end by retry, final failure, unrecoverable error and success
    jobs = {
        job_id: wait_state(job_id, "completed", "failed", timeout=10)
        for job_id in [failing, unrecoverable, *echoes]
    }
    # Then every job got the slot in turn, well before a leaked lease could lapse
    assert (jobs[failing]["state"], jobs[failing]["attemptsStarted"]) == ("failed", 2)
    assert jobs[failing]["attemptsMade"] == 2
    assert (jobs[unrecoverable]["state"], jobs[unrecoverable]["attemptsStarted"]) == ("failed", 1)
    assert all(jobs[e]["state"] == "completed" for e in echoes)
    assert max_overlap(run_intervals(list(jobs.values()))) == 1


def test_a_held_job_waits_in_the_delayed_set_without_using_an_attempt(limited_workers):
    # Given the single slot taken by a job that runs for 2 s
    long_job = add("test.sleep", {"ms": 2000}, queue=SINGLE).job_id
    wait_state(long_job, "active")
    # When another job arrives
    held = add("test.echo", {"held": True}, queue=SINGLE).job_id
    # Then it waits as a delayed record that has not been started
    waiting = wait_for(lambda: (r := record(held)) and r["state"] == "delayed" and r, timeout=5)
    assert (waiting["attemptsStarted"], waiting["attemptsMade"], waiting["runs"]) == (0, 0, [])
    # And it runs once the slot is free
    done = wait_state(held, "completed", timeout=15)
    assert ts(done["runs"][0]["startedAt"]) >= ts(record(long_job)["runs"][0]["finishedAt"])
    assert done["attemptsStarted"] == 1


def test_a_held_delivery_that_outran_its_records_commit_is_parked_not_dropped(limited_workers):
    # Given the single slot taken by a job that runs for 2 s
    long_job = add("test.sleep", {"ms": 2000}, queue=SINGLE).job_id
    wait_state(long_job, "active")
    # When a job is recorded and published inside a transaction that stays open meanwhile,
    # as a chain's next step is inside its parent's completing transaction, and its
    # delivery is held by the limit before the record is committed
    job_id = published_before_commit("test.echo", SINGLE, {"held": True}, hold_s=1.5)
    # Then the held delivery waited for the commit and parked the job, which runs once the
    # slot is free: not left to the reconciler, which republishes only after its grace (10 s)
    done = wait_state(job_id, "completed", "failed", timeout=8)
    assert done["state"] == "completed", done
    assert (done["attemptsStarted"], done["attemptsMade"]) == (1, 0)


def test_a_dead_workers_slot_frees_itself_and_its_held_job_is_not_lost(stack):
    # Given a single-slot queue whose slot a worker holds (3 s leases), with a job held behind it
    queue = unique("orphaned")
    env = {
        "KEEL_QUEUE_LIMITS": json.dumps({queue: {"concurrency": 1}}),
        "KEEL_LOCK_DURATION_S": "3",
    }
    victim = WorkerProcess(stack.home, unique("holder"), concurrency=2, queues=queue, extra_env=env)
    rescuer = WorkerProcess(stack.home, unique("heir"), concurrency=2, queues=queue, extra_env=env)
    victim.start()
    try:
        running = add("test.sleep", {"ms": 4000}, queue=queue).job_id
        wait_state(running, "active")
        held = add("test.echo", {"held": True}, queue=queue).job_id
        wait_for(lambda: record(held)["state"] == "delayed", timeout=5)
        # When that worker is SIGKILLed and another one takes over the queue
        victim.kill()
        rescuer.start()
        # Then once the dead slot's lease lapses, both run there: the stalled job
        # again, the held one on its first attempt
        done = wait_state(held, "completed", timeout=20)
        rerun = wait_state(running, "completed", timeout=20)
    finally:
        victim.kill()
        rescuer.stop()
    assert (done["attemptsStarted"], done["attemptsMade"]) == (1, 0)
    assert done["runs"][0]["worker"].startswith(f"{rescuer.name}@")
    assert (rerun["attemptsStarted"], rerun["stalledCount"]) == (2, 1)
    rescued_runs = [{"runs": [job["runs"][-1]]} for job in (done, rerun)]
    assert max_overlap(run_intervals(rescued_runs)) == 1  # the dead run's end is when it was found


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        '["reports"]',
        '{"reports": {"concurrency": 0}}',
        '{"reports": {"concurrency": "4"}}',
        '{"reports": {"rate": {"max": 10}}}',
        '{"reports": {"rate": {"max": 10, "duration_ms": 0}}}',
        '{"reports": {"burst": 3}}',
    ],
)
def test_a_malformed_limits_setting_is_refused_with_its_name(raw):
    with pytest.raises(ValueError, match="KEEL_QUEUE_LIMITS"):
        parse(raw)


def test_absent_limits_mean_unlimited():
    assert parse("") == {}
    limits = parse('{"reports": {"concurrency": 4, "rate": {"max": 10, "duration_ms": 2000}}}')
    assert (limits["reports"].concurrency, limits["reports"].rate.max) == (4, 10)
