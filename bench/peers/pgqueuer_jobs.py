"""pgqueuer's entrypoints for P1 and P2, and the worker that runs them.

``python -m bench.peers.pgqueuer_jobs 2`` runs what ``pgq run
bench.peers.pgqueuer_jobs:create_manager`` runs (see ``main``). pgqueuer runs
only coroutines; its retry executor requeues a failed job in the database.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import psycopg
from pgqueuer import DatabaseRetryEntrypointExecutor, Job, PsycopgDriver, Queries, QueueManager

from bench.peers import database_url

NOOP = "bench.pgqueuer.noop"
FLAKY = "bench.pgqueuer.flaky"


class PlannedFailure(Exception):
    """The first run of a flaky job fails on purpose."""


async def noop(job: Job) -> None:
    """Does nothing: what is left is pgqueuer's own cost per job."""
    return None


async def flaky(job: Job) -> None:
    """Fails its first run; the retry executor requeues it with no delay."""
    if job.attempts == 0:
        raise PlannedFailure("planned failure on the first run")
    return None


@asynccontextmanager
async def create_manager() -> AsyncIterator[QueueManager]:
    """The factory ``pgq run`` enters: one autocommit connection, both entrypoints."""
    connection = await psycopg.AsyncConnection.connect(database_url(), autocommit=True)
    try:
        manager = QueueManager(Queries(PsycopgDriver(connection)))
        manager.entrypoint(NOOP)(noop)
        retry_once = functools.partial(
            DatabaseRetryEntrypointExecutor, max_attempts=1, initial_delay=timedelta(0)
        )
        manager.entrypoint(FLAKY, executor_factory=retry_once)(flaky)
        print(f"pgqueuer worker ready: {NOOP}, {FLAKY}", flush=True)  # what the bench waits for
        yield manager
    finally:
        await connection.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.peers.pgqueuer_jobs CONCURRENCY``: the body of ``pgq run``.

    Its command function is called directly: the ``pgq`` CLI of this release
    hands the function its ``--log-level`` as a string where an enum is read,
    and stops. A dequeue batch of one and a cap of CONCURRENCY picked jobs: the
    worker holds no more jobs than it runs, like Celery's prefetch of one.
    """
    import sys

    from pgqueuer.adapters.cli import cli
    from pgqueuer.core.logconfig import LogLevel
    from pgqueuer.domain.types import QueueExecutionMode

    concurrency = int((argv if argv is not None else sys.argv[1:])[0])
    cli.run(
        factory_fn="bench.peers.pgqueuer_jobs:create_manager",
        factory_args=[],
        dequeue_timeout=30.0,
        batch_size=1,
        heartbeat_timeout=30.0,
        restart_delay=5.0,
        restart_on_failure=False,
        log_level=LogLevel.INFO,
        mode=QueueExecutionMode.continuous,
        max_concurrent_tasks=concurrency,
        shutdown_on_listener_failure=False,
    )


if __name__ == "__main__":
    main()
