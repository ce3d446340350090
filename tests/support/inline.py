"""Jobs run in the test process: a real Celery worker in a thread, for the logic tests.

``celery.contrib.testing.worker.start_worker`` runs Keel's app with its
bootsteps (the maintenance thread included) against the session's real Redis
and the module's real Postgres, with a thread pool instead of prefork
children. ``join`` waits for jobs to finish by polling their records with a
deadline — no fixed sleeps. What only a separate process can show (kills,
signals, restarts) stays in the tiers marked ``stack``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

from celery.contrib.testing.worker import start_worker

from tasks.jobs.model.models import FINISHED_STATES
from tests.support.client import record
from tests.support.stack import wait_for


@contextmanager
def inline_worker(concurrency: int = 8) -> Iterator[Any]:
    """A worker consuming Keel's queues from threads of this process (the jobs of the logic
    tests mostly wait: report steps, backoffs; threads overlap the waiting)."""
    from tasks.celery import app
    from tasks.platform.transport import Transport

    # Stopping waits for the consumer's BRPOP to time out (kombu: 1 s); a shorter one
    # here lets each module's worker stop at once. Only this process's consumer polls.
    with (
        patch.object(Transport, "brpop_timeout", 0.1),
        start_worker(
            app,
            pool="threads",
            concurrency=concurrency,
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=15,
        ) as worker,
    ):
        yield worker


def join(job_ids: Iterable[str], timeout: float = 60) -> dict[str, dict[str, Any]]:
    """Wait until every job is completed or failed; their records (as the API shows them)."""
    ids = list(job_ids)

    def finished() -> dict[str, dict[str, Any]] | None:
        found = {job_id: record(job_id) for job_id in ids}
        done = all(job and job["state"] in FINISHED_STATES for job in found.values())
        return found if done else None  # type: ignore[return-value]

    return wait_for(finished, timeout=timeout)
