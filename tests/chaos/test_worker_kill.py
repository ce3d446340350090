"""Scenario 1: a worker is SIGKILLed while 200 report jobs are in flight.

Why: a power cut takes a worker with its running jobs and its reserved
messages. The records must get every one of them run again elsewhere (lock
expiry → stalled → requeued; a message taken but not yet claimed leaves its
record waiting, and the reconciler publishes it again) and the artifact store
must keep one artifact per operation key even for jobs that ran twice.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tests.support.chaos import (
    add_reports,
    completed_runs,
    ensure_broker_epoch,
    job_rows,
    settle,
    stragglers,
)
from tests.support.client import unique
from tests.support.stack import wait_for

VICTIM_LOCK_S = 3  # the victim's job locks run out 3 s after it dies


def active_on(queue: str, worker: str) -> int:
    """Jobs of ``queue`` active right now under ``worker``'s lock."""
    with transaction() as session:
        return session.execute(
            text(
                "SELECT count(*) FROM jobs WHERE queue = :q AND state = 'active' "
                "AND runs -> -1 ->> 'worker' LIKE :w"
            ),
            {"q": queue, "w": f"{worker}@%"},
        ).scalar_one()


def completed_count(jobs: dict[str, str]) -> int:
    return sum(1 for row in job_rows(list(jobs)).values() if row["state"] == "completed")


def kill_during_in_flight_reports(spawn, count: int) -> None:
    # Given two workers on a dedicated queue, the victim holding short (3 s) job locks,
    queue = unique("chaos-kill")
    victim = spawn(
        "victim",
        concurrency=3,
        queues=queue,
        extra_env={"KEEL_LOCK_DURATION_S": str(VICTIM_LOCK_S)},
    )
    survivor = spawn("survivor", concurrency=3, queues=queue)
    # and `count` report jobs in flight on it
    jobs = add_reports(queue, count)
    # When the victim is SIGKILLed while it runs jobs, a fifth of the way through
    wait_for(
        lambda: completed_count(jobs) >= count // 5 and active_on(queue, victim.name) >= 2,
        timeout=60,
        interval=0.02,
    )
    victim.kill()
    killed_at = time.monotonic()
    # Then every job completes, by the survivor for whatever the victim held
    result = settle(jobs, timeout=90)
    took = time.monotonic() - killed_at
    print(
        f"\nscenario 1 (SIGKILL, {count} reports): {result.figure()}; "
        f"all done {took:.1f} s after the kill"
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert result.completed == count and result.duplicate_artifacts == 0
    rows = job_rows(list(jobs))
    interrupted = [
        row
        for row in rows.values()
        if any(
            run["worker"].startswith(f"{victim.name}@") and run.get("outcome") != "completed"
            for run in row["runs"]
        )
    ]
    assert interrupted, "the kill interrupted no job: nothing was tested"
    for row in interrupted:
        assert row["stalled_count"] == 1, row
        assert row["runs"][-1]["worker"].startswith(f"{survivor.name}@"), row
        assert completed_runs(row) == 1, row
    print(f"  {len(interrupted)} jobs were interrupted by the kill and rerun by the survivor")


def test_sigkill_during_200_in_flight_reports_completes_200_with_no_duplicate(spawn):
    """200/200 complete and one artifact per operation key after a worker is SIGKILLed."""
    kill_during_in_flight_reports(spawn, 200)


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(3))
def test_sigkill_during_200_in_flight_reports_repeatedly(spawn, round_no):
    """The same kill, three more times: the figure must not depend on where the kill lands."""
    kill_during_in_flight_reports(spawn, 200)


# A consumer on Keel's transport that reserves one message of a queue (unacknowledged, as a
# worker holds it before claiming its record) and then waits to be killed.
RESERVE_AND_WAIT = """
import sys, time
from kombu import Connection
with Connection(sys.argv[1], transport="tasks.platform.transport:Transport") as conn:
    message = conn.SimpleQueue(sys.argv[2]).get(block=True, timeout=30)
    print(message.headers["id"], flush=True)
    time.sleep(300)
"""


def test_a_message_reserved_by_a_killed_worker_runs_soon_after_it_is_reconciled(spawn):
    """A job whose message a killed worker took but never claimed runs again within
    the reconciler's grace and interval.

    The record is still waiting and nothing in Postgres is locked, so the
    promoter's stalled check cannot see it, and Keel's transport keeps no
    unacked copy of a recorded job's message in Redis (``tasks.platform.transport.QoS``):
    the reconciler finds the waiting job without a message and publishes it
    again. The window is narrow in a real worker (between taking a message and
    claiming its record), so it is opened on purpose here with a bare consumer.
    """
    settings = get_settings()
    bound_s = settings.reconcile_grace_s + settings.reconcile_interval_s
    # Given a report job whose message a consumer took and holds without acknowledging
    queue = unique("chaos-reserved")
    ensure_broker_epoch()
    jobs = add_reports(queue, 1)
    holder = subprocess.Popen(
        [sys.executable, "-c", RESERVE_AND_WAIT, settings.celery_broker_url, queue],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == next(iter(jobs))
        # When that consumer is SIGKILLed, with another worker on the queue
        holder.kill()
        holder.wait()
        killed_at = time.monotonic()
        spawn("rescuer", concurrency=1, queues=queue)
        # Then the job completes once the reconciler has published it again, exactly once
        result = settle(jobs, timeout=bound_s + 120)
        took = time.monotonic() - killed_at
    finally:
        holder.kill()
    print(
        f"\nscenario 1b (reserved message of a killed consumer): {result.figure()}; "
        f"ran {took:.1f} s after the kill (reconciler grace + interval {bound_s:.0f} s)"
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert took < bound_s + 30  # the rescuer's start and the run itself fit in 30 s
