"""Keel handlers for P1, P2 and P11, loaded into a real Keel worker with ``-I bench.jobs``.

They live in the bench, not in ``tasks/``: production workers never know them.
"""

from __future__ import annotations

import time

from bench import pickup
from tasks.celery import app
from tasks.jobs import JobContext, handler

QUEUE = "default"
NOOP = "bench.noop"
FLAKY = "bench.flaky"
ADD = "bench.add"
STAMP = "bench.stamp"


class PlannedFailure(Exception):
    """The first run of a flaky job fails on purpose."""


@handler(NOOP, queue=QUEUE)
def noop(job: JobContext) -> None:
    """Does nothing: what is left is Keel's own cost per job (records, events, claims)."""
    return None


@handler(FLAKY, queue=QUEUE)
def flaky(job: JobContext) -> None:
    """Fails its first run; ``attempts=2`` with no backoff runs it again at once."""
    if job.attempts_made == 0:
        raise PlannedFailure("planned failure on the first run")
    return None


@handler(STAMP, queue=QUEUE)
def stamp(job: JobContext) -> None:
    """P11's handler: writes when it started (``bench.pickup``), nothing else."""
    started = time.time()
    pickup.record(job.data["out"], job.data["added"], job.data["due"], started)


@app.task(name=ADD)
def add(x: int, y: int, ms: int = 0) -> int:
    """P9's task, a plain ``@app.task`` on Keel's app: the sum after ``ms`` milliseconds."""
    time.sleep(ms / 1000)
    return x + y
