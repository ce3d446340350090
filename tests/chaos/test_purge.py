"""Scenario: ``celery purge`` deletes the messages of 20 waiting jobs, then a worker starts.

Why: the records still say waiting but nothing in the broker will ever wake
those jobs. The reconciler (``tasks.jobs.upkeep.reconcile``) must give each one a
message again — within the bound docs/jobs.md states (a minute) — so each
runs exactly once, and must leave alone a backlog whose messages are still
in the broker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from sqlalchemy import text

from tasks.jobs import add
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.chaos import ensure_broker_epoch, priority_lists
from tests.support.client import unique, wait_state
from tests.support.stack import PROJECT_ROOT

BOUND_S = 60  # "republished and run within a minute of a purge" (docs/jobs.md)


def queued_ids(queue: str) -> list[str]:
    raw = [m for name in priority_lists(queue) for m in redis_client().lrange(name, 0, -1)]
    return sorted(json.loads(m)["headers"]["id"] for m in raw)


def celery_purge(queue: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "purge", "-f", "-Q", queue],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_purged_jobs_run_once_each_and_a_backlog_is_never_republished(spawn):
    # Given, with no worker on their queues, a backlog of 20 jobs (their messages kept)
    ensure_broker_epoch()  # a broker that lost everything is broker_reset's case, not this one
    backlog_queue, purged_queue = unique("backlog"), unique("purged")
    backlog = sorted(add("test.echo", {"i": i}, queue=backlog_queue).job_id for i in range(20))
    # and 20 waiting jobs whose messages `celery purge` deletes
    jobs = [add("test.echo", {"i": i}, queue=purged_queue).job_id for i in range(20)]
    assert "Purged 20 messages" in celery_purge(purged_queue)
    assert queued_ids(purged_queue) == []
    try:
        # When a worker starts on the purged queue
        spawn("purge", concurrency=2, queues=purged_queue)
        started = time.monotonic()
        # Then every purged job completes within the bound, each with exactly one run
        done = [wait_state(job_id, "completed", timeout=BOUND_S) for job_id in jobs]
        took = time.monotonic() - started
        print(f"\npurge: 20/20 purged jobs completed {took:.1f} s after the worker started")
        assert took < BOUND_S
        assert [j["id"] for j in done if j["attemptsStarted"] != 1 or len(j["runs"]) != 1] == []
        # And the backlog's messages are exactly its 20: the rounds that republished the purged
        # jobs looked at it too (it is older) and found every job's message in place
        assert queued_ids(backlog_queue) == backlog
    finally:
        redis_client().delete(*priority_lists(backlog_queue))
        with transaction() as session:
            session.execute(text("DELETE FROM jobs WHERE queue = :q"), {"q": backlog_queue})
