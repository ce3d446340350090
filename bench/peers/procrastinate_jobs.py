"""procrastinate's app and tasks for P1, P2 and P11, loaded by its own worker CLI.

``procrastinate --app=bench.peers.procrastinate_jobs.app worker``. The tasks
are coroutines, procrastinate's cheapest kind (a sync task runs in a thread).
"""

from __future__ import annotations

import time

from procrastinate import App, JobContext, PsycopgConnector, RetryStrategy

from bench import pickup
from bench.peers import database_url

QUEUE = "bench-procrastinate"
NOOP = "bench.procrastinate.noop"
FLAKY = "bench.procrastinate.flaky"
STAMP = "bench.procrastinate.stamp"

app = App(connector=PsycopgConnector(conninfo=database_url()))


class PlannedFailure(Exception):
    """The first run of a flaky task fails on purpose."""


@app.task(name=NOOP, queue=QUEUE)
async def noop() -> None:
    """Does nothing: what is left is procrastinate's own cost per job."""
    return None


@app.task(
    name=FLAKY,
    queue=QUEUE,
    pass_context=True,
    retry=RetryStrategy(max_attempts=1, retry_exceptions=[PlannedFailure]),
)
async def flaky(context: JobContext) -> None:
    """Fails its first run; the retry strategy runs it again at once (no wait)."""
    assert context.job is not None
    if context.job.attempts == 0:
        raise PlannedFailure("planned failure on the first run")
    return None


@app.task(name=STAMP, queue=QUEUE)
async def stamp(out: str, added: float, due: float) -> None:
    """P11's task: writes when it started (``bench.pickup``), nothing else."""
    pickup.record(out, added, due, time.time())
