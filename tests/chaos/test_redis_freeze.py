"""Redis (and Postgres) frozen (SIGSTOP) while a worker claims, finishes and acks jobs.

A frozen server keeps its sockets open and answers nothing: every command in
flight times out, the acks of the jobs that finish meanwhile among them.
kombu freed a message's prefetch slot only once Redis answered its ack, so
the worker's three slots were held for good and its consumer never sent
another BRPOP: after SIGCONT it consumed nothing, ever (seen from outside on
``keel up``: 199 of 202 jobs left waiting). Now every job completes once
within a bounded time after SIGCONT, on the same worker, with no restart.
30 s here; 60 s in the slow tier.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.chaos import add_reports, settle, stragglers, tally
from tests.support.client import unique
from tests.support.outages import embedded_postgres, embedded_redis, postgres_hung, redis_hung
from tests.support.stack import wait_for

DONE_WITHIN_S = 60.0  # after SIGCONT: the visibility timeout (15 s here) and the promoter's rounds


def frozen_under_load(stack, spawn, freeze_s: float) -> None:
    embedded_redis(stack)  # skip against an external Redis: it is not ours to freeze
    queue = unique("freeze")
    worker = spawn("freeze", queues=queue, concurrency=3)
    # Given a worker busy with a backlog (claiming, finishing, acking) ...
    jobs = add_reports(queue, 90)
    wait_for(lambda: tally(jobs).completed >= 6, timeout=60, interval=0.2)
    # When Redis freezes for `freeze_s` while jobs keep being added (parked: no broker)
    added_meanwhile: dict[str, str] = {}
    with redis_hung(stack):
        frozen_at = time.monotonic()
        adder = threading.Thread(
            target=lambda: added_meanwhile.update(add_reports(queue, 10)), daemon=True
        )
        adder.start()
        while time.monotonic() - frozen_at < freeze_s:
            time.sleep(0.2)
        adder.join(timeout=0)
    thawed_at = time.monotonic()
    adder.join(timeout=60)
    assert not adder.is_alive(), "adding jobs stayed stuck after Redis came back"
    jobs.update(added_meanwhile)
    # Then every job completes once, on the same worker, within the bound
    result = settle(jobs, timeout=DONE_WITHIN_S)
    took = time.monotonic() - thawed_at
    print(
        f"\nRedis frozen {freeze_s:.0f} s under load: {result.figure()}; "
        f"all done {took:.1f} s after SIGCONT"
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert worker.process.poll() is None, "the worker exited"


def test_a_worker_consumes_again_after_redis_froze_30_s_under_load(stack, spawn):
    frozen_under_load(stack, spawn, freeze_s=30)


@pytest.mark.slow
def test_a_worker_consumes_again_after_redis_froze_60_s_under_load(stack, spawn):
    frozen_under_load(stack, spawn, freeze_s=60)


def test_jobs_complete_after_postgres_froze_30_s_with_workers_mid_claim(stack, spawn):
    embedded_postgres(stack)  # skip against an external Postgres: it is not ours to freeze
    queue = unique("pgfreeze")
    worker = spawn("pgfreeze", queues=queue, concurrency=3)
    # Given a worker claiming and finishing a backlog
    jobs = add_reports(queue, 60)
    wait_for(lambda: tally(jobs).completed >= 6, timeout=60, interval=0.2)
    # When every Postgres process freezes for 30 s (claims and completions in flight)
    with postgres_hung(stack):
        time.sleep(30)
    thawed_at = time.monotonic()
    # Then every job completes once, on the same worker: a round trip that outlived the
    # freeze gave its delivery back, and the claim refuses a second run
    result = settle(jobs, timeout=DONE_WITHIN_S + 30)
    print(
        f"\nPostgres frozen 30 s mid-claim: {result.figure()}; "
        f"all done {time.monotonic() - thawed_at:.1f} s after SIGCONT"
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert worker.process.poll() is None, "the worker exited"
