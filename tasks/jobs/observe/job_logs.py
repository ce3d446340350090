"""Reading a job's log (``tasks.jobs.run.job_log`` writes it): a page of lines after a
number, for ``GET /api/v1/jobs/<id>/logs``, or the newest, for the job's page. The caller
has checked that its principal may see the job (``queries.get_owned``)."""

from __future__ import annotations

from typing import Any

from tasks.jobs.observe.queries import iso
from tasks.jobs.store import logs as store
from tasks.jobs.store.logs import LogLine
from tasks.platform.db import transaction

MAX_PAGE = 1_000
DEFAULT_PAGE = 100


def shown(line: LogLine) -> dict[str, Any]:
    return {
        "seq": line.seq,
        "attempt": line.attempt,
        "loggedAt": iso(line.logged_at),
        "message": line.message,
    }


def page(job_id: str, after: int = 0, limit: int = DEFAULT_PAGE) -> dict[str, Any]:
    """Lines numbered above ``after``, oldest first; ``written`` counts every line the job
    wrote (those numbered up to ``written - kept`` were trimmed), ``next`` the ``after`` of
    the following page (``None``: none yet)."""
    with transaction() as session:
        lines = store.lines(session, job_id, after, limit + 1)
        written = store.written(session, job_id)
    more = len(lines) > limit
    lines = lines[:limit]
    return {
        "jobId": job_id,
        "logs": [shown(line) for line in lines],
        "written": written,
        "next": lines[-1].seq if more else None,
    }


def newest(job_id: str, limit: int = DEFAULT_PAGE) -> tuple[list[dict[str, Any]], int]:
    """The newest ``limit`` lines, oldest first, and how many the job wrote in all."""
    with transaction() as session:
        lines = store.newest(session, job_id, limit)
        written = store.written(session, job_id)
    return [shown(line) for line in lines], written
