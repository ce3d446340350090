"""Keel on Redis with Sentinel: a primary lost under load is followed to the promoted replica.

Debian's ``redis-server`` and ``redis-sentinel`` on loopback (``tests.support.sentinel``):
a primary, its replica and three sentinels that fail over a second after losing it. Two
workers and a producer, processes of their own, have ``KEEL_REDIS_URL`` set to the
sentinels (``sentinel://…?master_name=keel``); Postgres is the suite's. While the producer
adds 500 jobs of 50 ms, the replica is cut off for the next ``LOST_AFTER`` jobs' writes,
then the primary is killed (SIGKILL): those writes, messages included, are gone, as
asynchronous replication may lose a primary's last writes, but certainly and in numbers.
Every job must complete, each run once, the lost messages must be published again, and jobs
added after the kill must complete within ``RESUME_BOUND_S`` of it, the bound the operations
docs state.

The reconciler is what brings back a waiting job whose message the replica never got;
its round runs here every 2 s for jobs published 3 s ago or more (15 s and 10 s in
production: docs/operations/index.md, "What an outage of each costs").
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from tasks.jobs.upkeep.broker_reset import EPOCH_KEY
from tasks.platform.db import transaction
from tests.support.client import unique
from tests.support.sentinel import SentinelGroup, program
from tests.support.stack import PROJECT_ROOT, WorkerProcess, republished, wait_for

pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(
        program("redis-sentinel") is None or program("redis-server") is None,
        reason="needs Debian's redis-server and redis-sentinel",
    ),
]

JOBS = 500
RATE = 150  # jobs added a second
CUT_AFTER = 200  # jobs recorded when the replica is cut off its primary
LOST_AFTER = 40  # jobs recorded after that, written to the primary alone, when it is killed
# The docs' bound on a Redis failover: a job added after the primary was lost completes
# within this (measured 4-9 s on a busy 2-core host: Sentinel's 1 s detection, the
# promotion, the workers' reconnection). down-after-milliseconds in production is often
# 5-30 s: add it.
RESUME_BOUND_S = 15.0
SETTLE_S = 60.0


@dataclass
class Failover:
    resumed_s: float  # the kill → the first completion of a job added after it
    settled_s: float  # the kill → every job completed
    lost: list[str]
    twice: list[str]
    repaired: int  # jobs published again by the reconciler (their first message was lost)


def jobs_of(ids: list[str]) -> dict[str, dict]:
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT id, state, attempts_started, runs, created_at, finished_on "
                "FROM jobs WHERE id = ANY(:ids)"
            ),
            {"ids": ids},
        ).mappings()
        return {row["id"]: dict(row) for row in rows}


def recorded_on(queue: str) -> int:
    with transaction() as session:
        found = session.execute(
            text("SELECT count(*) FROM jobs WHERE queue = :queue"), {"queue": queue}
        ).scalar()
    return int(found or 0)


def ids_on(queue: str) -> list[str]:
    with transaction() as session:
        return list(
            session.execute(
                text("SELECT id FROM jobs WHERE queue = :queue"), {"queue": queue}
            ).scalars()
        )


def run_failover(home: Path) -> Failover:
    """One group, two workers and a producer; the primary killed under load."""
    group = SentinelGroup(home / "sentinel")
    queue = unique("failover")
    env = {
        "KEEL_RECONCILE_INTERVAL_S": "2",
        "KEEL_RECONCILE_GRACE_S": "3",
    }
    workers: list[WorkerProcess] = []
    producer: subprocess.Popen | None = None
    try:
        group.start()
        env["KEEL_REDIS_URL"] = group.url
        # A new Redis has no broker epoch: the first promoter to look would republish every
        # waiting job of the suite's database into it. It has one, as a deployed Redis has.
        group.primary_client().set(EPOCH_KEY, "failover-test")
        for name in ("a", "b"):
            worker = WorkerProcess(
                home, unique(f"sentinel-{name}"), concurrency=3, queues=queue, extra_env=env
            )
            workers.append(worker)
            worker.start()
        out = home / f"{queue}.json"
        produce = ["produce", queue, str(JOBS), str(RATE), str(out)]
        producer = subprocess.Popen(
            [sys.executable, "-m", "tests.support.sentinel", *produce],
            cwd=PROJECT_ROOT,
            env={**os.environ, **env},
            stdout=(home / "producer.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: recorded_on(queue) >= CUT_AFTER, timeout=30, interval=0.05)
        cut = group.cut_replica()
        cut_at = recorded_on(queue)
        wait_for(lambda: recorded_on(queue) >= cut_at + LOST_AFTER, timeout=30, interval=0.02)
        killed = group.kill_primary()
        killed_at = datetime.now(UTC)
        group.mend_replica(cut)
        assert producer.wait(timeout=60) == 0, (home / "producer.log").read_text()[-3000:]
        ids = json.loads(out.read_text())
        assert len(ids) == JOBS and sorted(ids) == sorted(ids_on(queue))
        # Sentinel promotes the replica (the producer may finish before it has)
        wait_for(lambda: group.primary().name != killed.name, timeout=30, interval=0.1)

        def settled() -> bool:
            return all(row["state"] == "completed" for row in jobs_of(ids).values())

        with contextlib.suppress(AssertionError):  # the figures below say what did not
            wait_for(settled, timeout=SETTLE_S, interval=0.5)
        rows = jobs_of(ids)
        done = [row for row in rows.values() if row["state"] == "completed"]
        after = [row for row in done if row["created_at"] > killed_at]
        assert after, "no job added after the kill completed"
        return Failover(
            resumed_s=(min(row["finished_on"] for row in after) - killed_at).total_seconds(),
            settled_s=(max(row["finished_on"] for row in done) - killed_at).total_seconds(),
            lost=[i for i, row in rows.items() if row["state"] != "completed"],
            twice=[
                i
                for i, row in rows.items()
                if row["attempts_started"] != 1
                or sum(1 for run in row["runs"] if run.get("outcome") == "completed") != 1
                or len(row["runs"]) != 1
            ],
            repaired=republished(workers, queue),
        )
    except BaseException:
        print(group.log_tail())
        for worker in workers:
            print(worker.log_tail(80))
        raise
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        for worker in workers:
            worker.stop()
        group.stop()


def check(failover: Failover, run: str) -> None:
    print(
        f"\nRedis failover {run}: resumed {failover.resumed_s:.2f} s after the kill, "
        f"all {JOBS} completed {failover.settled_s:.2f} s after it; "
        f"{len(failover.lost)} lost, {len(failover.twice)} run twice, "
        f"{failover.repaired} republished"
    )
    assert failover.lost == [] and failover.twice == [], failover
    # the messages only the killed primary had were published again, by Keel's reconciler
    assert failover.repaired > 0, failover
    assert failover.resumed_s <= RESUME_BOUND_S, failover


@pytest.fixture
def home(stack, tmp_path) -> Iterator[Path]:
    yield tmp_path


def test_a_primary_killed_under_load_is_followed_and_every_job_runs_once(home):
    check(run_failover(home), "1/1")


@pytest.mark.slow
def test_three_failovers_each_lose_nothing_and_run_nothing_twice(home):
    for run in range(3):
        check(run_failover(home / f"run{run}"), f"{run + 1}/3")
