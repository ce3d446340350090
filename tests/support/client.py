"""Talking to the API and reading job records the way a user would."""

from __future__ import annotations

import itertools
import os
import uuid
from datetime import datetime
from typing import Any

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.observe.queries import describe, get
from tests.support.stack import wait_for
from web.tokens import issue_token


def token(
    tenant: str = "acme", user: str = "alice", roles: tuple[str, ...] = (), ttl: int = 4 * 3600
) -> str:
    return issue_token(os.environ["KEEL_SECRET_KEY"], tenant, user, list(roles), ttl)


def bearer(tenant: str = "acme", user: str = "alice", roles: tuple[str, ...] = ()) -> dict:
    return {"Authorization": f"Bearer {token(tenant, user, roles)}"}


def metrics_headers() -> dict:
    """What Prometheus sends for ``GET /metrics``: the metrics token (``KEEL_METRICS_TOKEN``)."""
    return {"Authorization": f"Bearer {os.environ['KEEL_METRICS_TOKEN']}"}


def unique(prefix: str = "r") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def record(job_id: str) -> dict[str, Any] | None:
    job = get(job_id)
    return describe(job) if job is not None else None


def claimed_job(**opts: Any) -> Any:
    """A job on a queue no worker consumes, claimed here as a worker would claim it (a
    ``tasks.jobs.store.runs.ClaimedJob``)."""
    from tasks.jobs import JobOptions, add
    from tasks.jobs.store import runs
    from tasks.platform.db import transaction

    job_id = add("test.echo", {}, queue=unique("quiet"), opts=JobOptions(**opts)).job_id
    with transaction() as session:
        claimed = runs.claim(session, job_id, uuid.uuid4().hex, 30, "tester@host")
    assert claimed is not None
    return claimed


def wait_state(job_id: str, *states: str, timeout: float = 30) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        current = record(job_id)
        return current if current and current["state"] in states else None

    return wait_for(reached, timeout=timeout)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def waits_between_runs(job: dict[str, Any]) -> list[float]:
    """Seconds from each run's end to the next run's start, from the job's run timeline."""
    runs = job["runs"]
    return [
        (ts(nxt["startedAt"]) - ts(prev["finishedAt"])).total_seconds()
        for prev, nxt in itertools.pairwise(runs)
    ]


def ended_jobs(tenant: str, name: str, n: int, state: str) -> None:
    """``n`` jobs ``name`` of ``tenant`` on ``default``, one try each, run until ``state``."""
    for _ in range(n):
        job = add(name, {}, queue="default", opts=JobOptions(attempts=1), owner=Owner(tenant, "a"))
        wait_state(job.job_id, state)
