"""Scenario 3: Redis restarts without persistence while 1,000 jobs wait in it.

Why: every waiting job's message lives only in Redis. The records must
bring them all back (the epoch key is gone, so a promoter republishes every
waiting job), none may run twice, and the worker that was connected before
the restart must reconnect and consume them by itself: nobody restarts
workers after a broker blip.
"""

from __future__ import annotations

import time

import pytest
import redis

from tasks.jobs import add
from tasks.platform.config import get_settings
from tests.support.chaos import (
    add_reports,
    completed_runs,
    job_rows,
    priority_lists,
    settle,
    stragglers,
)
from tests.support.client import unique
from tests.support.outages import embedded_redis
from tests.support.stack import wait_for


def broker(command: str, *args):
    """One Redis command on a fresh connection (the server restarts under the test)."""
    client = redis.Redis.from_url(get_settings().redis, socket_timeout=5)
    try:
        return client.execute_command(command, *args)
    finally:
        client.close()


def restart_while_jobs_wait(stack, spawn, tmp_path, count: int) -> None:
    embedded_redis(stack)  # skip against an external Redis: it is not ours to restart
    # Given a worker connected to a dedicated queue, both its processes busy holding,
    queue = unique("chaos-reset")
    consumer = spawn(
        "reset", concurrency=2, queues=queue, extra_env={"KEEL_REPORT_STEP_PAUSE_MS": "0"}
    )
    pid = consumer.process.pid
    release = tmp_path / "release"
    holders = [
        add("test.hold", {"until": str(release), "maxMs": 180_000}, queue=queue).job_id
        for _ in range(2)
    ]
    wait_for(lambda: all(r["state"] == "active" for r in job_rows(holders).values()), timeout=30)
    # and `count` report jobs waiting in Redis behind them
    jobs = add_reports(queue, count)
    # (plus, at most, the holders' own messages: held longer than the visibility timeout,
    # they are restored to the queue, and refused by the claim when they come round)
    waiting = sum(broker("LLEN", name) for name in priority_lists(queue))
    assert count <= waiting <= count + len(holders)
    # When Redis restarts empty
    broker("SET", f"{queue}:sentinel", "1")
    restarted_at = time.monotonic()
    stack.restart_redis()
    assert broker("EXISTS", f"{queue}:sentinel") == 0  # it really lost its data
    release.touch()
    # Then the same worker process consumes every job once, without being restarted
    result = settle(jobs, timeout=240)
    took = time.monotonic() - restarted_at
    print(
        f"\nscenario 3 (Redis restart, {count} waiting): {result.figure()}; "
        f"all done {took:.1f} s after the restart"
    )
    assert result.clean, (result.figure(), stragglers(result))
    rows = job_rows(list(jobs))
    assert [
        job_id
        for job_id, row in rows.items()
        if row["attempts_started"] != 1 or len(row["runs"]) != 1 or completed_runs(row) != 1
    ] == []
    assert consumer.process.poll() is None and consumer.process.pid == pid
    workers = {row["runs"][0]["worker"].split("@")[0] for row in rows.values()}
    assert workers == {consumer.name}
    assert all(r["state"] == "completed" for r in job_rows(holders).values())


def test_redis_restart_with_1000_waiting_jobs_completes_each_once(stack, spawn, tmp_path):
    """1,000/1,000 complete once each, consumed by the worker connected before the restart."""
    restart_while_jobs_wait(stack, spawn, tmp_path, 1000)


@pytest.mark.slow
def test_redis_restart_with_3000_waiting_jobs_completes_each_once(stack, spawn, tmp_path):
    """The same with 3,000 waiting jobs: republishing takes several promoter batches."""
    restart_while_jobs_wait(stack, spawn, tmp_path, 3000)
