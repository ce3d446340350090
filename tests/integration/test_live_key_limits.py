"""A job type's key limit overridden live for one tenant's key through the system API, while
its jobs run on real worker processes that are never restarted.

``test.keyed3`` declares 3 jobs of one ``partner`` at a time. Tenant A's ``p-1`` is lowered
to 1 while A's ``p-2`` and tenant B's ``p-1`` (the same key, another tenant's) run: from 5 s
after, never more than 1 of A's ``p-1`` runs while the others still run 3 each; cleared, A's
``p-1`` runs 3 again. Measured from the job records' runs (startedAt, finishedAt).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from tasks.jobs import Owner, add
from tests.support.client import metrics_headers, ts, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for
from tests.support.timeline import active_count, max_overlap, run_intervals

pytestmark = pytest.mark.stack  # starts processes of its own

QUEUE = unique("livekeys")
JOB = "test.keyed3"
URL = f"/api/v1/system/key-limits/{JOB}"
TENANT_A, TENANT_B = unique("ta"), unique("tb")
SETTLE = timedelta(seconds=5)
RAISED_SETTLE = timedelta(seconds=3)
# No tenant cap in the way: each tenant runs up to 6 of the 12 slots here.
UNCAPPED = {
    "KEEL_TENANT_QUOTAS": '{"maxRunning": 100, "maxRunningPerQueue": 100, "systemReserve": 0}'
}


@pytest.fixture(scope="module")
def workers(stack):
    """Two worker processes of 6: 12 could run at once, the three keys need 9."""
    started = [
        WorkerProcess(stack.home, unique(f"lk{n}"), concurrency=6, queues=QUEUE, extra_env=UNCAPPED)
        for n in (1, 2)
    ]
    for worker in started:
        worker.start()
    yield started
    for worker in started:
        worker.stop()


def clipped(
    intervals: list[tuple[datetime, datetime]], after: datetime, before: datetime | None = None
) -> list[tuple[datetime, datetime]]:
    """The parts of ``intervals`` inside ``[after, before]``."""
    parts = [(max(start, after), min(end, before) if before else end) for start, end in intervals]
    return [(start, end) for start, end in parts if start < end]


def settled_after(intervals: list[tuple[datetime, datetime]], since: datetime) -> float:
    """Seconds from ``since`` to the last instant more than one run was open (0: none)."""
    last = since
    for start, end in intervals:
        for other_start, other_end in intervals:
            if (start, end) != (other_start, other_end) and other_start <= start < other_end:
                last = max(last, min(end, other_end))
    return (last - since).total_seconds()


def add_jobs(tenant: str, partner: str, n: int) -> list[str]:
    owner = Owner(tenant, "u")
    data = {"partner": partner, "ms": 500}
    return [add(JOB, data, queue=QUEUE, owner=owner).job_id for _ in range(n)]


def test_one_tenants_key_lowered_live_to_1_while_others_run_3_and_cleared_runs_3(workers, client):
    pids = [worker.process.pid for worker in workers]
    # Given 0.5 s jobs of a type that declares 3 per key: tenant A's keys p-1 and p-2, and
    # tenant B's p-1, all running 3 at once
    ids = {
        "A p-1": add_jobs(TENANT_A, "p-1", 70),
        "A p-2": add_jobs(TENANT_A, "p-2", 60),
        "B p-1": add_jobs(TENANT_B, "p-1", 60),
    }
    wait_for(lambda: active_count(QUEUE) == 9, timeout=30, interval=0.02)
    # When A's p-1 is lowered to 1 through the API, and the override cleared 8 s later
    body = {"tenant": TENANT_A, "key": "p-1", "maxRunning": 1, "reason": "drill: partner p-1"}
    answer = client.put(URL, json=body, headers=metrics_headers())
    assert answer.status_code == 200, answer.get_data(as_text=True)
    mine = [o for o in answer.get_json()["overrides"] if o["tenant"] == TENANT_A]
    lowered = ts(mine[0]["setAt"])
    time.sleep(8)
    cleared = client.delete(
        URL,
        query_string={"tenant": TENANT_A, "key": "p-1", "reason": "drill over: back to 3"},
        headers=metrics_headers(),
    )
    assert cleared.status_code == 200 and cleared.get_json()["changed"], cleared.get_json()
    raised = ts(client.get(URL, headers=metrics_headers()).get_json()["changes"][0]["recordedAt"])
    jobs = {
        group: [wait_state(job_id, "completed", "failed", timeout=90) for job_id in job_ids]
        for group, job_ids in ids.items()
    }
    # Then (by the records) from 5 s after lowering until the clear, never more than 1 of A's
    # p-1 ran, while A's p-2 and B's p-1 ran 3 at once; from 3 s after the clear, 3 again
    runs = {group: run_intervals(found) for group, found in jobs.items()}
    before = {g: max_overlap([(s, e) for s, e in r if s < lowered]) for g, r in runs.items()}
    low = {g: max_overlap(clipped(r, lowered + SETTLE, raised)) for g, r in runs.items()}
    after = max_overlap(clipped(runs["A p-1"], raised + RAISED_SETTLE))
    settled = settled_after(clipped(runs["A p-1"], lowered, raised), lowered)
    print(
        f"max concurrent runs before lowering {before}; from 5 s after lowering A's p-1 to 1"
        f" until the clear {low} (more than one of A's p-1 ran until {settled:.2f} s after"
        f" the change); A's p-1 from 3 s after the clear {after}"
    )
    assert before == {"A p-1": 3, "A p-2": 3, "B p-1": 3}
    assert low == {"A p-1": 1, "A p-2": 3, "B p-1": 3}
    assert after == 3
    # And no worker was restarted, and being held cost no job an attempt
    assert [worker.process.pid for worker in workers] == pids
    assert all(worker.process.poll() is None for worker in workers)
    every = [job for found in jobs.values() for job in found]
    assert {(j["state"], j["attemptsMade"], j["attemptsStarted"]) for j in every} == {
        ("completed", 0, 1)
    }
