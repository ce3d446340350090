"""Reading the queue event streams from the test process (another process than the worker)."""

from __future__ import annotations

from tasks.jobs import events


def of_job(queue: str, job_id: str) -> list[dict]:
    return [e for e in events.read([queue]) if e["jobId"] == job_id]


def names(queue: str, job_id: str) -> list[str]:
    return [e["event"] for e in of_job(queue, job_id)]
