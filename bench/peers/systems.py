"""The bench side of each peer: its schema, its worker process and one measured batch.

A batch enqueues ``n`` jobs one by one from this process, with the peer's own
client, and ends when the peer's own records say the last one finished:
procrastinate's ``procrastinate_events`` (``succeeded`` / ``failed`` rows and
their ``at``), pgqueuer's ``pgqueuer_log`` (its ``created``). Both keep those
records after a job is done, as Keel does; the batch's cleanup deletes its own
rows so every repetition runs against tables of the same size.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from importlib import import_module

import psycopg

from bench.env import BenchEnv
from bench.peers import database_url
from bench.plan import Batch, Run, batch_timeout
from bench.procs import Child, LogReadyChild

POLL_S = 0.1


# What ``fig_jobs`` alternates: a fresh worker per repetition, and a batch of ``k`` jobs.
System = tuple[Callable[[], Child], Callable[[int], Batch]]


def importable(module: str) -> bool:
    """Whether ``module`` imports: a peer that is absent or broken here sits the figure out."""
    try:
        import_module(module)
    except ImportError:
        return False
    return True


class ProcrastinateWorker(LogReadyChild):
    """``procrastinate --app=... worker -q <queue> -c N``, job records kept."""

    ready_line = "Starting worker on queues"

    def __init__(self, env: BenchEnv, concurrency: int) -> None:
        from bench.peers.procrastinate_jobs import QUEUE

        args = [
            sys.executable,
            "-m",
            "procrastinate",
            "--app=bench.peers.procrastinate_jobs.app",
            "worker",
            "-n",
            "procrastinate-bench",
            "-q",
            QUEUE,
            "-c",
            str(concurrency),
            "--delete-jobs",
            "never",
        ]
        super().__init__(env, "procrastinate-bench", args)


class PgqueuerWorker(LogReadyChild):
    """``pgq run``'s body with a cap of N picked jobs (see ``pgqueuer_jobs.main``)."""

    ready_line = "pgqueuer worker ready"

    def __init__(self, env: BenchEnv, concurrency: int) -> None:
        args = [sys.executable, "-m", "bench.peers.pgqueuer_jobs", str(concurrency)]
        super().__init__(env, "pgqueuer-bench", args)


def _wait_until(
    connection: psycopg.Connection, query: str, ids: Sequence[int], n: int, who: str
) -> None:
    """Poll ``query`` (jobs done among ``ids``) until all ``n`` are."""
    deadline = time.monotonic() + batch_timeout(n)
    while True:
        row = connection.execute(query, (ids,)).fetchone()
        done = row[0] if row else 0
        if done >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{who}: {n - done} of {n} jobs unfinished")
        time.sleep(POLL_S)


def install_procrastinate() -> None:
    """procrastinate's schema, once per database (its tables are all ``procrastinate_*``)."""
    from bench.peers.procrastinate_jobs import app

    with psycopg.connect(database_url(), autocommit=True) as connection:
        row = connection.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    if row and row[0] is None:
        with app.open():
            app.schema_manager.apply_schema()


_PROCRASTINATE_DONE = (
    "SELECT count(*) FROM procrastinate_jobs WHERE id = ANY(%s)"
    " AND status IN ('succeeded', 'failed', 'cancelled', 'aborted')"
)
_PROCRASTINATE_RESULT = (
    "SELECT count(*) FILTER (WHERE type = 'failed'),"
    " count(*) FILTER (WHERE type = 'deferred_for_retry'),"
    " max(at) FILTER (WHERE type IN ('succeeded', 'failed'))"
    " FROM procrastinate_events WHERE job_id = ANY(%s)"
)

# How long a retried job waited for a worker: from its retry to its next start.
_PROCRASTINATE_RETRY_WAIT = (
    "SELECT coalesce(extract(epoch FROM max(next.at - retry.at)), 0)"
    " FROM procrastinate_events retry CROSS JOIN LATERAL ("
    "  SELECT min(at) AS at FROM procrastinate_events"
    "  WHERE job_id = retry.job_id AND type = 'started' AND id > retry.id) next"
    " WHERE retry.job_id = ANY(%s) AND retry.type = 'deferred_for_retry'"
)


def procrastinate_batch(n: int, flaky: bool) -> Batch:
    """Defer ``n`` tasks with ``task.defer()`` (sync); the end is the last event's ``at``."""
    from bench.peers import procrastinate_jobs

    task = procrastinate_jobs.flaky if flaky else procrastinate_jobs.noop
    connection = psycopg.connect(database_url(), autocommit=True)
    try:
        with procrastinate_jobs.app.open():
            started = time.time()
            ids = [task.defer() for _ in range(n)]
            enqueued = time.time() - started
        _wait_until(connection, _PROCRASTINATE_DONE, ids, n, "procrastinate")
        row = connection.execute(_PROCRASTINATE_RESULT, (ids,)).fetchone()
        assert row is not None
        failed, retried, last = row
        waited = connection.execute(_PROCRASTINATE_RETRY_WAIT, (ids,)).fetchone()
    finally:
        connection.close()

    def cleanup() -> None:  # its events go with their jobs (ON DELETE CASCADE)
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs WHERE id = ANY(%s)", (ids,))

    return {
        "rate": n / (last.timestamp() - started),
        "enqueue_rate": n / enqueued,
        "failed": failed,
        "failed_runs": retried + failed,
        "retry_wait_max_s": float(waited[0]) if waited else 0.0,
    }, cleanup


def install_pgqueuer() -> None:
    """pgqueuer's schema, once per database (``pgqueuer``, ``pgqueuer_log``, ... tables)."""
    from pgqueuer import PsycopgDriver, Queries

    async def install() -> None:
        connection = await psycopg.AsyncConnection.connect(database_url(), autocommit=True)
        try:
            queries = Queries(PsycopgDriver(connection))
            if not await queries.schema_is_installed():
                await queries.install()
        finally:
            await connection.close()

    asyncio.run(install())


_PGQUEUER_DONE = (
    "SELECT count(*) FROM pgqueuer_log WHERE job_id = ANY(%s)"
    " AND status IN ('successful', 'exception', 'canceled', 'deleted', 'failed')"
)
_PGQUEUER_RESULT = (
    "SELECT count(*) FILTER (WHERE status IN ('exception', 'failed')),"
    " count(*) FILTER (WHERE status = 'queued' AND traceback IS NOT NULL),"
    " max(created) FILTER (WHERE status IN ('successful', 'exception', 'failed'))"
    " FROM pgqueuer_log WHERE job_id = ANY(%s)"
)


def pgqueuer_batch(n: int, flaky: bool) -> Batch:
    """Enqueue ``n`` jobs with ``SyncQueries.enqueue``; the end is the last log row's time."""
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    from bench.peers.pgqueuer_jobs import FLAKY, NOOP

    connection = psycopg.connect(database_url(), autocommit=True)
    try:
        queries = SyncQueries(SyncPsycopgDriver(connection))
        entrypoint = FLAKY if flaky else NOOP
        started = time.time()
        ids = [queries.enqueue(entrypoint, None)[0] for _ in range(n)]
        enqueued = time.time() - started
        _wait_until(connection, _PGQUEUER_DONE, ids, n, "pgqueuer")
        row = connection.execute(_PGQUEUER_RESULT, (ids,)).fetchone()
        assert row is not None
        failed, retried, last = row
    finally:
        connection.close()

    def cleanup() -> None:  # the log, leftovers in the queue, and the log's rollup
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute("DELETE FROM pgqueuer_log WHERE job_id = ANY(%s)", (ids,))
            conn.execute("DELETE FROM pgqueuer WHERE id = ANY(%s)", (ids,))
            conn.execute(
                "DELETE FROM pgqueuer_statistics WHERE entrypoint = ANY(%s)", ([NOOP, FLAKY],)
            )

    return {
        "rate": n / (last.timestamp() - started),
        "enqueue_rate": n / enqueued,
        "failed": failed,
        "failed_runs": retried + failed,
    }, cleanup


PEERS = ("procrastinate", "pgqueuer")

# Why a peer sits out P2 although it is installed (P1 measures it all the same).
NOT_IN_RETRY_FIGURE = {
    "pgqueuer": "a job its retry executor requeues with no delay is picked up again only "
    "after about a second (ten flaky jobs took about 8 s with two at a time), so a "
    "thousand would keep one repetition busy for many minutes",
}


def peers(run: Run, flaky: bool) -> tuple[dict[str, System], list[str]]:
    """The installed peers, schema in place, and a note for each one left out."""
    conc = run.sizes.worker_concurrency
    found: dict[str, System] = {}
    notes: list[str] = []
    if importable("procrastinate"):
        install_procrastinate()
        found["procrastinate"] = (
            lambda: ProcrastinateWorker(run.env, conc),
            lambda k: procrastinate_batch(k, flaky),
        )
    else:
        notes.append("procrastinate left out: not installed (pip install -e '.[bench]')")
    if not importable("pgqueuer"):
        notes.append("pgqueuer left out: not installed (pip install -e '.[bench]')")
    elif flaky:
        notes.append(f"pgqueuer left out: {NOT_IN_RETRY_FIGURE['pgqueuer']}")
    else:
        install_pgqueuer()
        found["pgqueuer"] = (
            lambda: PgqueuerWorker(run.env, conc),
            lambda k: pgqueuer_batch(k, flaky),
        )
    return found, notes
