"""Writing a job's log: ``job.log(message)`` in a ``handler(job)``, ``self.log(message)`` in a
bound Celery-style task (BullMQ's ``job.log()``).

Each line is stored at once (one statement; ``tasks.jobs.store.logs`` keeps the newest
``KEEL_JOB_LOG_LINES``) and written to the worker's own log too, at INFO, with the job's
fields, so an operator finds it on the job's page and in the process's log alike.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import IntegrityError

from tasks.jobs.store import logs as store
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.platform.logs import redact

log = logging.getLogger("tasks.jobs.job_log")


def echo(message: object) -> str:
    """The line as it is stored (secrets masked as in every log line), written to this
    process's log."""
    line = redact(store.clean(message))
    log.info("%s", line)
    return line


def write(job_id: str, attempt: int, message: object) -> int | None:
    """Store a line of the job's log; its number (``None``: the job's record is gone).

    A concurrent append of the same job (threads of one handler) that took the next number
    has saved its own line: this one takes the number after, so no line is lost. The
    database being away raises, as ``update_progress`` does.
    """
    line = echo(message)
    keep = get_settings().job_log_lines
    while True:
        try:
            with transaction(one_statement=True) as session:
                seq = store.append(session, job_id, attempt, line, keep)
        except (store.JobGone, IntegrityError):  # (deleted between the statement's reads)
            return None
        if seq is not None:
            return seq
