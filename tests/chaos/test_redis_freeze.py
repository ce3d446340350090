"""Redis (and Postgres) frozen (SIGSTOP) while a worker claims, finishes and acks jobs.

A frozen server keeps its sockets open and answers nothing: every command in
flight times out, the acks of the jobs that finish meanwhile among them.
kombu freed a message's prefetch slot only once Redis answered its ack, so
the worker's three slots were held for good and its consumer never sent
another BRPOP: after SIGCONT it consumed nothing, ever (seen from outside on
``keel up``: 199 of 202 jobs left waiting). Now every job completes once
within a bounded time after SIGCONT, on the same worker, with no restart.
5 s and 30 s here; 60 s in the slow tier.

Jobs added while Redis does not answer are parked in Postgres and published
later by a worker's promoter (``tasks.jobs.intake.promote``), 200 a transaction, each
batch's messages sent in one pipeline before its commit. Redis freezing again
while the promoter works through such a backlog must lose none and run none
twice: a batch Redis stops answering part way through is parked again whole
(its messages that did reach Redis find their records delayed, the claim
ignores them, and the jobs are published again when due), and the batches
after it are parked without a try. Here Redis freezes again the moment the
first message of a 300-job backlog reaches it, for 10 s.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from tasks.platform.config import get_settings
from tests.support.chaos import (
    add_reports,
    job_rows,
    priority_lists,
    settle,
    stragglers,
    tally,
)
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


def test_a_worker_consumes_again_after_redis_froze_5_s_under_load(stack, spawn):
    frozen_under_load(stack, spawn, freeze_s=5)


@pytest.mark.slow  # a 30 s outage; the 5 s freeze above runs by default
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


BACKLOG = 300  # parked jobs: two of the promoter's batches (tasks.jobs.intake.promote.BATCH, 200)
REFROZEN_S = 10.0


class Load:
    """Report jobs added on ``queue`` every ``every_s`` from a thread, until stopped
    (parked while Redis does not answer, like any other add)."""

    def __init__(self, queue: str, every_s: float = 0.25) -> None:
        self.queue, self.every_s = queue, every_s
        self.added: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.added.update(add_reports(self.queue, 1))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "adding jobs stayed stuck after Redis came back"


def delayed(job_ids: list[str]) -> int:
    return sum(1 for row in job_rows(job_ids).values() if row["state"] == "delayed")


def test_redis_freezing_again_while_the_promoter_publishes_a_parked_backlog(stack, spawn):
    embedded_redis(stack)  # skip against an external Redis: it is not ours to freeze
    load_queue, parked_queue = unique("freeze-load"), unique("freeze-parked")
    worker = spawn(
        "promote",
        queues=f"{load_queue},{parked_queue}",
        concurrency=3,
        extra_env={"KEEL_REPORT_STEP_PAUSE_MS": "0"},
    )
    pid = worker.process.pid
    watcher = redis.Redis.from_url(get_settings().redis, socket_timeout=0.5)
    lists = priority_lists(parked_queue)
    # Given a worker claiming, finishing and acking a steady load
    jobs = add_reports(load_queue, 30)
    with Load(load_queue) as load:
        wait_for(lambda: tally(jobs).completed >= 6, timeout=60, interval=0.2)
        # When Redis freezes while 300 more jobs are added: they are parked in Postgres
        with redis_hung(stack):
            frozen_at = time.monotonic()
            parked = add_reports(parked_queue, BACKLOG)
            adding_s = time.monotonic() - frozen_at
            assert delayed(list(parked)) == BACKLOG
            time.sleep(1.5)  # every one due (parked for 1 s)
        # and it freezes again as soon as the promoter's first messages reach it
        started = time.monotonic()
        while not (sent := sum(watcher.llen(name) for name in lists)):
            assert time.monotonic() - started < 30, "the promoter published nothing"
        with redis_hung(stack):
            refrozen_at = time.monotonic()
            time.sleep(1.0)  # the promoter's try times out (0.5 s): what it sent is parked again
            unpublished = delayed(list(parked))
            time.sleep(REFROZEN_S - 1.0)
        thawed_at = time.monotonic()
    jobs.update(load.added)
    jobs.update(parked)
    # Then every job completes once, on the same worker, within the bound
    result = settle(jobs, timeout=DONE_WITHIN_S)
    took = time.monotonic() - thawed_at
    print(
        f"\nRedis frozen while {BACKLOG} jobs were added ({adding_s:.1f} s, all parked), "
        f"then again {(refrozen_at - started) * 1000:.0f} ms after SIGCONT, once {sent} of "
        f"their messages had reached it ({unpublished} records still parked), "
        f"{REFROZEN_S:.0f} s; {len(load.added)} more added meanwhile: {result.figure()}; "
        f"all done {took:.1f} s after the last SIGCONT"
    )
    assert result.clean, (result.figure(), stragglers(result))
    # (the second freeze came while the promoter was publishing the backlog, not after)
    assert unpublished > 0, "the promoter had published the whole backlog before the freeze"
    assert worker.process.poll() is None and worker.process.pid == pid, "the worker exited"
