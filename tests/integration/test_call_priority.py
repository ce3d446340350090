"""A call's ``priority=`` as a worker serves it: a tenant's urgent jobs run before its own
backlog, and not before another tenant's job sent earlier.

One worker process (concurrency 1) starts once every message waits, so the order in which
the jobs start is the order the broker's priority lists hand them out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tasks.jobs import Owner, acting_as
from tasks.platform.db import transaction
from tests.support.jobs import echo
from tests.support.stack import WorkerProcess, wait_for

pytestmark = [pytest.mark.stack, pytest.mark.usefixtures("stack")]


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"prio-{uuid.uuid4().hex[:10]}"
    yield name
    with transaction() as session:
        session.execute(text("DELETE FROM jobs WHERE queue = :q"), {"q": name})


def started_in_order(queue: str, count: int) -> list[str]:
    def all_done() -> list[str]:
        with transaction() as session:
            rows = session.execute(
                text(
                    "SELECT id FROM jobs WHERE queue = :q AND state = 'completed' "
                    "ORDER BY processed_on"
                ),
                {"q": queue},
            ).scalars()
            done = list(rows)
        return done if len(done) == count else []

    found: list[str] = wait_for(all_done, timeout=60, interval=0.2)
    return found


def test_a_tenant_s_urgent_calls_run_before_its_backlog_and_after_others_turns(stack, queue):
    a = Owner(f"tenant-{uuid.uuid4().hex[:8]}", "backfill")
    b = Owner(f"tenant-{uuid.uuid4().hex[:8]}", "someone")
    # Given a tenant's backfill of 8 jobs at Redis's lowest priority, then another tenant's
    # job, then the first tenant's two urgent calls (no priority: Redis's first)
    with acting_as(a):
        backfill = [echo.apply_async(kwargs={"n": i}, queue=queue, priority=9).id for i in range(8)]
    with acting_as(b):
        other = echo.apply_async(kwargs={"n": 0}, queue=queue).id
    with acting_as(a):
        urgent = [echo.apply_async(kwargs={"n": i}, queue=queue).id for i in range(2)]
    # When one worker process serves the queue
    worker = WorkerProcess(stack.home, f"prio-{queue}", concurrency=1, queues=queue)
    worker.start()
    try:
        order = started_in_order(queue, 11)
    finally:
        worker.stop()
    place = {job_id: order.index(job_id) for job_id in order}
    # Then the tenant's first urgent call runs before all of its backfill but the job that
    # was first in line, and its second before the backfill's second half
    assert all(place[urgent[0]] < place[job_id] for job_id in backfill[1:]), order
    assert all(place[urgent[1]] < place[job_id] for job_id in backfill[4:]), order
    # And the other tenant's job, sent before the urgent calls, is not passed by them
    assert place[other] < place[urgent[0]], order
    assert all(place[other] < place[job_id] for job_id in backfill[1:]), order
