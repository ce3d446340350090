"""Writing a job's log: ``job.log(message)`` in a ``handler(job)``, ``self.log(message)`` in a
bound Celery-style task (BullMQ's ``job.log()``).

Each line is stored at once (one statement; ``tasks.jobs.store.logs`` keeps the newest
``KEEL_JOB_LOG_LINES``) and written to the worker's own log too, at INFO, with the job's
fields, so an operator finds it on the job's page and in the process's log alike.
"""

from __future__ import annotations

import logging

from tasks.config import get_settings
from tasks.db import transaction
from tasks.jobs.store import logs as store

log = logging.getLogger("tasks.jobs.job_log")
_TRIES = 3  # a concurrent append of the same job took the number: take the next


def echo(message: object) -> str:
    """The line as it is stored, written to this process's log."""
    line = store.clean(message)
    log.info("%s", line)
    return line


def write(job_id: str, attempt: int, message: object) -> int | None:
    """Store a line of the job's log; its number (``None``: the job's record is gone)."""
    line = echo(message)
    keep = get_settings().job_log_lines
    for _ in range(_TRIES):
        with transaction(one_statement=True) as session:
            seq = store.append(session, job_id, attempt, line, keep)
        if seq is not None:
            return seq
    return None
