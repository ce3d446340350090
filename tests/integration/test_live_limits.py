"""A queue's concurrency changed live through the system API, while its jobs run on real
worker processes that are never restarted.

Measured from the job records' runs (startedAt, finishedAt): before the change 4 run at
once; from 5 s after lowering it to 1, never more than 1; from 5 s after raising it back
to 4, 4 again.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest

from tasks.jobs import add
from tasks.platform.config import reload_settings
from tests.support.client import metrics_headers, ts, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for
from tests.support.timeline import active_count, max_overlap, run_intervals

pytestmark = pytest.mark.stack  # starts processes of its own

QUEUE = unique("live")
DEFAULTS = {"KEEL_QUEUE_LIMITS": json.dumps({QUEUE: {"concurrency": 4}})}
SETTLE = timedelta(seconds=5)


@pytest.fixture(scope="module")
def workers(stack):
    """Two worker processes of 3 each: 6 could run at once, the queue's default allows 4."""
    started = [
        WorkerProcess(
            stack.home, unique(f"live{n}"), concurrency=3, queues=QUEUE, extra_env=DEFAULTS
        )
        for n in (1, 2)
    ]
    for worker in started:
        worker.start()
    yield started
    for worker in started:
        worker.stop()


def set_concurrency(client, n: int) -> datetime:
    """PUT the queue's concurrency; when it was set, by Postgres's clock (as the runs)."""
    body = {"concurrency": n, "reason": f"incident drill: concurrency to {n}"}
    answer = client.put(
        f"/api/v1/system/queues/{QUEUE}/limits", json=body, headers=metrics_headers()
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    shown = answer.get_json()
    assert (shown["effective"]["concurrency"], shown["source"]) == (n, "live"), shown
    return ts(shown["override"]["setAt"])


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


def test_concurrency_lowered_live_holds_within_5_s_and_raised_runs_4_again(workers, client):
    pids = [worker.process.pid for worker in workers]
    # Given 100 jobs of 0.6 s on a queue whose default (KEEL_QUEUE_LIMITS) is 4 at once
    ids = [add("test.sleep", {"ms": 600}, queue=QUEUE).job_id for _ in range(100)]
    wait_for(lambda: active_count(QUEUE) == 4, timeout=30, interval=0.02)
    # When the API lowers it to 1 while they run, and raises it to 4 again 8 s later
    lowered = set_concurrency(client, 1)
    time.sleep(8)
    raised = set_concurrency(client, 4)
    jobs = [wait_state(job_id, "completed", "failed", timeout=60) for job_id in ids]
    # Then (by the records) 4 ran at once before, never more than 1 from 5 s after lowering,
    # and 4 at once again from 5 s after raising
    runs = run_intervals(jobs)
    before = max_overlap([(s, e) for s, e in runs if s < lowered])
    low = max_overlap(clipped(runs, lowered + SETTLE, raised))
    high = max_overlap(clipped(runs, raised + SETTLE))
    settled = settled_after(clipped(runs, lowered, raised), lowered)
    print(
        f"max concurrent runs: {before} before, {low} from 5 s after lowering to 1 (more than"
        f" one ran until {settled:.2f} s after it), {high} from 5 s after raising to 4"
    )
    assert (before, low, high) == (4, 1, 4)
    # And no worker was restarted, and being held cost no job an attempt
    assert [worker.process.pid for worker in workers] == pids
    assert all(worker.process.poll() is None for worker in workers)
    assert {(j["state"], j["attemptsMade"], j["attemptsStarted"]) for j in jobs} == {
        ("completed", 0, 1)
    }


@pytest.fixture
def same_defaults(monkeypatch):
    """The API's process with the workers' KEEL_QUEUE_LIMITS (it shows the defaults it has)."""
    monkeypatch.setenv("KEEL_QUEUE_LIMITS", DEFAULTS["KEEL_QUEUE_LIMITS"])
    reload_settings()
    yield
    monkeypatch.undo()
    reload_settings()


def test_clearing_the_live_limit_brings_back_the_default_with_its_audit(
    workers, client, same_defaults
):
    # Given a live override of the queue (concurrency 1)
    set_concurrency(client, 1)
    # When it is cleared
    url = f"/api/v1/system/queues/{QUEUE}/limits"
    cleared = client.delete(
        url, query_string={"reason": "drill over: back to default"}, headers=metrics_headers()
    )
    # Then the default is in force, and every change is in the audit, newest first
    assert cleared.status_code == 200, cleared.get_data(as_text=True)
    shown = cleared.get_json()
    assert (shown["changed"], shown["source"], shown["override"]) == (
        True,
        "KEEL_QUEUE_LIMITS",
        None,
    )
    assert shown["effective"] == {"concurrency": 4, "rate": None}
    changes = client.get(url, headers=metrics_headers()).get_json()["changes"]
    assert (changes[0]["before"], changes[0]["after"]) == ({"concurrency": 1}, None)
    assert changes[1]["after"] == {"concurrency": 1}
    assert {c["actor"] for c in changes} == {"api:metrics-token"}
    # And 4 jobs run at once again
    ids = [add("test.sleep", {"ms": 800}, queue=QUEUE).job_id for _ in range(8)]
    jobs = [wait_state(job_id, "completed", "failed", timeout=30) for job_id in ids]
    assert max_overlap(run_intervals(jobs)) == 4
