"""Limits by key across two worker processes of concurrency 4: one job per key at a time
(first come, first run; newest wins; first wins), keys progressing side by side, and a start
rate per key. The handlers (``tests.support.jobs``) declare the keys."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from tasks.celery import app as celery_app
from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.end.cancel import cancel_many
from tasks.jobs.model.models import CANCELLABLE_STATES
from tasks.platform.db import transaction
from tests.support.client import record, ts, unique, wait_state
from tests.support.jobs import celery_keyed, nap
from tests.support.stack import WorkerProcess, wait_for, worker_pair
from tests.support.timeline import max_in_window, max_overlap, run_intervals

pytestmark = pytest.mark.stack  # starts processes of its own

QUEUE = unique("keyed")


@pytest.fixture(scope="module")
def workers(stack):
    """Two worker processes of concurrency 4 each, on the module's queue."""
    with worker_pair(stack.home, unique("keyed"), QUEUE) as started:
        yield started


def ended(job_ids: list[str], timeout: float) -> list[dict]:
    return [wait_state(j, "completed", "failed", "cancelled", timeout=timeout) for j in job_ids]


def audit_reasons(job_ids: list[str]) -> dict[str, list[str]]:
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT job_id, details ->> 'reason' AS reason FROM job_actions"
                " WHERE job_id = ANY(:ids)"
            ),
            {"ids": job_ids},
        ).all()
    found: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        found[row.job_id].append(row.reason)
    return found


def test_one_job_per_key_runs_at_a_time_while_the_keys_progress_side_by_side(workers):
    # Given 4 keys, when 40 jobs of 250 ms are added, 10 per key, interleaved
    keys = [unique("customer") for _ in range(4)]
    ids = {key: [] for key in keys}
    for n in range(10):
        for key in keys:
            ids[key].append(
                add("test.keyed", {"customer": key, "ms": 250, "n": n}, queue=QUEUE).job_id
            )
    jobs = {key: ended(ids[key], timeout=60) for key in keys}
    # Then every job completed once, waiting for its key cost no attempt
    everything = [job for key in keys for job in jobs[key]]
    assert {(j["state"], j["attemptsMade"], j["attemptsStarted"]) for j in everything} == {
        ("completed", 0, 1)
    }
    # never two jobs of one key ran at once, by the records' run times
    for key in keys:
        assert max_overlap(run_intervals(jobs[key])) == 1, key
    # and the keys ran side by side: all four at once at some moment
    assert max_overlap(run_intervals(everything)) == 4


def test_the_next_job_of_a_key_is_woken_when_its_slot_is_given_back(workers):
    # When 8 jobs of one key, 500 ms each, arrive 50 ms apart (all but the first wait in
    # line, parked: each would ask again on its own only 2 to 2.5 s later)
    key = unique("customer")
    ids = []
    for n in range(8):
        ids.append(add("test.keyed", {"customer": key, "ms": 500, "n": n}, queue=QUEUE).job_id)
        time.sleep(0.05)
    jobs = ended(ids, timeout=60)
    # Then they ran one at a time, in the order they arrived
    assert {j["state"] for j in jobs} == {"completed"}
    runs = [(ts(j["runs"][0]["startedAt"]), ts(j["runs"][0]["finishedAt"])) for j in jobs]
    assert [start for start, _ in runs] == sorted(start for start, _ in runs)
    assert max_overlap(run_intervals(jobs)) == 1
    # each woken as the one before gave its slot back, not by its own next ask
    gaps = [(runs[n + 1][0] - runs[n][1]).total_seconds() for n in range(7)]
    print("gaps between a key's runs (s):", [round(gap, 3) for gap in gaps])
    assert max(gaps) < 1.5


def test_a_celery_task_s_key_is_read_from_its_keyword_arguments(workers):
    # When a Celery task limited per customer_id is called 6 times for one customer
    customer = unique("customer")
    calls = [
        celery_keyed.apply_async(kwargs={"customer_id": customer, "ms": 300}, queue=QUEUE)
        for _ in range(6)
    ]
    jobs = ended([call.id for call in calls], timeout=40)
    # Then they ran one at a time, each once
    assert {(j["state"], j["attemptsStarted"]) for j in jobs} == {("completed", 1)}
    assert max_overlap(run_intervals(jobs)) == 1


def test_a_killed_workers_key_slot_frees_itself_and_the_next_job_of_the_key_runs(stack):
    # Given a worker (3 s leases) running a job of a key, the next job of the key in line
    env = {"KEEL_LOCK_DURATION_S": "3"}
    queue = unique("keyed-kill")
    victim = WorkerProcess(stack.home, unique("victim"), concurrency=2, queues=queue, extra_env=env)
    heir = WorkerProcess(stack.home, unique("heir"), concurrency=2, queues=queue, extra_env=env)
    key = unique("customer")
    victim.start()
    try:
        running = add("test.keyed", {"customer": key, "ms": 5000}, queue=queue).job_id
        wait_state(running, "active")
        waiting = add("test.keyed", {"customer": key, "ms": 0}, queue=queue).job_id
        wait_for(lambda: record(waiting)["state"] == "delayed", timeout=10)
        # When the worker is SIGKILLed and another takes over the queue
        victim.kill()
        heir.start()
        # Then the dead run's slot lapses with its lease, and both jobs run, never together
        done = wait_state(waiting, "completed", timeout=30)
        rerun = wait_state(running, "completed", timeout=30)
    finally:
        victim.kill()
        heir.stop()
    assert (done["attemptsStarted"], done["attemptsMade"]) == (1, 0)
    assert (rerun["attemptsStarted"], rerun["stalledCount"]) == (2, 1)
    last_runs = [{"runs": [job["runs"][-1]]} for job in (done, rerun)]
    assert max_overlap(run_intervals(last_runs)) == 1


def test_a_run_hung_past_its_time_limit_gives_its_key_slot_up(stack):
    # Given a threads-pool worker (it cannot stop a run; 2 s leases) and a job of a key
    # whose run hangs 8 s past its 1 s time limit
    queue = unique("keyed-hung")
    env = {"KEEL_LOCK_DURATION_S": "2"}
    threads = WorkerProcess(
        stack.home, unique("threads"), concurrency=2, queues=queue, pool="threads", extra_env=env
    )
    key = unique("customer")
    threads.start()
    try:
        hung = add(
            "test.keyed", {"customer": key, "ms": 8000}, queue=queue, opts=JobOptions(timeout=1000)
        )
        started = ts(wait_state(hung.job_id, "active")["runs"][0]["startedAt"])
        # When the next job of its key comes
        after = add("test.keyed", {"customer": key, "ms": 0}, queue=queue).job_id
        # Then it runs once the hung run's slot lapsed with its lease, not when it returns
        done = wait_state(after, "completed", timeout=30)
    finally:
        threads.stop()
    ran_at = ts(done["runs"][0]["startedAt"])
    print(f"the next job of the key started {(ran_at - started).total_seconds():.1f} s in")
    assert (ran_at - started).total_seconds() < 7


def test_cancel_in_progress_the_newest_job_of_a_key_wins(workers):
    # When 5 jobs of one key, each 2 s long, are added 200 ms apart
    key = unique("repo")
    ids = []
    for n in range(5):
        ids.append(add("test.keyed_latest", {"repo": key, "ms": 2000, "n": n}, queue=QUEUE).job_id)
        time.sleep(0.2)
    jobs = ended(ids, timeout=40)
    # Then only the last completes; the others are cancelled, each audited with the reason
    assert [j["state"] for j in jobs] == ["cancelled"] * 4 + ["completed"]
    reasons = audit_reasons(ids[:4])
    for job_id in ids[:4]:
        assert any("superseded by job" in (r or "") for r in reasons[job_id]), reasons[job_id]
    assert not any(run.get("outcome") == "completed" for j in jobs[:4] for run in j["runs"])
    assert jobs[4]["result"] == {"ran": 2000}


def test_cancel_newest_the_first_job_of_a_key_wins(workers):
    # When 5 jobs of one key, each 2 s long, are added 200 ms apart
    key = unique("repo")
    ids = []
    for n in range(5):
        ids.append(add("test.keyed_first", {"repo": key, "ms": 2000, "n": n}, queue=QUEUE).job_id)
        time.sleep(0.2)
    jobs = ended(ids, timeout=40)
    # Then only the first completes; the others are cancelled without a run, with the reason
    assert [j["state"] for j in jobs] == ["completed"] + ["cancelled"] * 4
    assert all(j["attemptsStarted"] == 0 for j in jobs[1:])
    reasons = audit_reasons(ids[1:])
    for job_id in ids[1:]:
        assert any("cancel_newest" in (r or "") for r in reasons[job_id]), reasons[job_id]


def test_a_key_with_a_long_line_does_not_hold_back_another_key(workers):
    # Given key A with 200 jobs of 1 s each, one running and the rest in line
    crowded, alone = unique("customer"), unique("customer")
    line = [
        add("test.keyed", {"customer": crowded, "ms": 1000}, queue=QUEUE).job_id for _ in range(200)
    ]
    try:
        # When key B's single job is added after them
        added = datetime.now(UTC)
        other = add("test.keyed", {"customer": alone, "ms": 0}, queue=QUEUE).job_id
        done = wait_state(other, "completed", timeout=30)
        # Then it starts within 3 of A's job durations, not after A's line
        waited = (ts(done["runs"][0]["startedAt"]) - added).total_seconds()
        print(f"key B's job started {waited:.2f} s after it was added")
        assert waited < 3.0
    finally:
        cancel_many(line, CANCELLABLE_STATES, by="test")


def test_a_key_rate_spaces_the_starts_of_one_key_without_using_attempts(workers):
    # Given a rate of 5 starts per second per key, when 50 jobs of one key are added at once
    key = unique("api")
    ids = [add("test.keyed_rated", {"apiKey": key, "n": n}, queue=QUEUE).job_id for n in range(50)]
    jobs = ended(ids, timeout=60)
    # Then all complete, none failed, no attempt used by waiting
    assert {(j["state"], j["attemptsMade"], j["attemptsStarted"]) for j in jobs} == {
        ("completed", 0, 1)
    }
    starts = [ts(j["runs"][0]["startedAt"]) for j in jobs]
    span = (max(starts) - min(starts)).total_seconds()
    print(f"50 starts over {span:.1f} s, at most {max_in_window(starts, 1.0)} in a second")
    # no second held more than 5 of them, so the 50 took at least 9 s
    assert max_in_window(starts, 1.0) <= 5
    assert span >= 9


def test_two_tenants_jobs_with_one_key_do_not_share_it(workers):
    # When two tenants each add a job of one key under cancel_newest, and under the default
    repo = unique("repo")
    first_wins = [
        add("test.keyed_first", {"repo": repo, "ms": 1000}, queue=QUEUE, owner=Owner(t, "u"))
        for t in (unique("acme"), unique("globex"))
    ]
    customer = unique("customer")
    in_line = [
        add("test.keyed", {"customer": customer, "ms": 1000}, queue=QUEUE, owner=Owner(t, "u"))
        for t in (unique("acme"), unique("globex"))
    ]
    jobs = ended([added.job_id for added in first_wins + in_line], timeout=40)
    # Then none is cancelled by the other tenant's, and each pair ran side by side
    assert [j["state"] for j in jobs] == ["completed"] * 4
    assert max_overlap(run_intervals(jobs[:2])) == 2
    assert max_overlap(run_intervals(jobs[2:])) == 2


def test_a_call_s_concurrency_key_limits_a_type_that_declares_none(workers):
    # When 6 jobs of a type without key limits are added with one call key, 3 with another
    key, other = unique("repo"), unique("repo")
    opts, other_opts = JobOptions(concurrencyKey=key), JobOptions(concurrencyKey=other)
    ids = [add("test.sleep", {"ms": 300}, queue=QUEUE, opts=opts).job_id for _ in range(6)]
    others = [add("test.sleep", {"ms": 300}, queue=QUEUE, opts=other_opts).job_id for _ in range(3)]
    jobs, other_jobs = ended(ids, timeout=40), ended(others, timeout=40)
    # Then each key's jobs ran one at a time, each once, while the keys went side by side
    assert {(j["state"], j["attemptsStarted"]) for j in jobs + other_jobs} == {("completed", 1)}
    assert max_overlap(run_intervals(jobs)) == 1
    assert max_overlap(run_intervals(other_jobs)) == 1
    assert max_overlap(run_intervals(jobs + other_jobs)) == 2


def test_a_call_s_key_holds_for_the_job_s_retries(workers):
    # When 4 calls with one key each ask for a retry at their first run, then run 500 ms
    key = unique("repo")
    calls = [
        nap.apply_async(
            kwargs={"seconds": 0.5, "retry_first": True},
            queue=QUEUE,
            job_options={"concurrencyKey": key},
        )
        for _ in range(4)
    ]
    jobs = ended([call.id for call in calls], timeout=40)
    # Then the retried runs, published again from the records, still went one at a time
    assert {(j["state"], j["attemptsStarted"]) for j in jobs} == {("completed", 2)}
    retried = [{"runs": [job["runs"][-1]]} for job in jobs]
    assert max_overlap(run_intervals(retried)) == 1


def test_a_message_sent_without_keel_cannot_act_in_a_tenant_s_key(workers):
    # Given a tenant's running job of a key, the newest wins
    repo, tenant = unique("repo"), unique("acme")
    owned = add(
        "test.keyed_latest", {"repo": repo, "ms": 1500}, queue=QUEUE, owner=Owner(tenant, "u")
    ).job_id
    wait_state(owned, "active")
    # When a message sent without Keel names the tenant in its headers
    foreign = celery_app.send_task(
        "test.keyed_latest",
        kwargs={"repo": repo, "ms": 0},
        queue=QUEUE,
        headers={"keel_tenant": tenant},
    )
    # Then it is a system job's, and the tenant's job is not superseded
    assert wait_state(foreign.id, "completed", "cancelled", timeout=20)["state"] == "completed"
    assert wait_state(owned, "completed", "cancelled", timeout=20)["state"] == "completed"
