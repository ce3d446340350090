"""What happens, in the same transaction, when a job reaches completed or failed.

The job's simple-mode deduplication claim is released. Retention follows
BullMQ's ``removeOnComplete`` / ``removeOnFail``: the finishing job's
setting trims its queue's finished records of the same kind, lazily, at the
moment another job finishes. A failed record is copied to the failure
archive in the same statement that trims it.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.orm import Session

from tasks.db import transaction
from tasks.jobs import dedup
from tasks.jobs.records import ClaimedJob

log = logging.getLogger(__name__)

_ARCHIVE = """
    WITH gone AS ({delete} RETURNING *)
    INSERT INTO failed_jobs_archive (id, queue, name, data, opts, tenant_id, user_id,
        attempts_made, attempts_started, failed_reason, stacktrace, runs, created_at, finished_on)
    SELECT id, queue, name, data, opts, tenant_id, user_id, attempts_made, attempts_started,
        failed_reason, stacktrace, runs, created_at, finished_on FROM gone
    ON CONFLICT (id) DO UPDATE SET failed_reason = EXCLUDED.failed_reason,
        runs = EXCLUDED.runs, finished_on = EXCLUDED.finished_on, archived_at = now()
"""


def retention(setting: Any) -> tuple[int | None, int | None] | None:
    """``(count, age_s)`` to keep, or ``None`` to keep everything."""
    if setting is None or setting is False:
        return None
    if setting is True:
        return (0, None)
    if isinstance(setting, int):
        return (setting, None)
    return (setting.get("count"), setting.get("age"))


def trim(session: Session, queue: str, state: str, setting: Any) -> int:
    """Delete finished records beyond the newest ``count`` or older than ``age``."""
    keep = retention(setting)
    if keep is None:
        return 0
    count, age = keep
    deletes = []
    if count is not None:
        deletes.append(
            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE queue = :queue "
            "AND state = :state ORDER BY finished_on DESC OFFSET :count FOR UPDATE SKIP LOCKED)"
        )
    if age is not None:
        deletes.append(
            "DELETE FROM jobs WHERE queue = :queue AND state = :state "
            "AND finished_on < clock_timestamp() - make_interval(secs => :age)"
        )
    removed = 0
    for delete in deletes:
        statement = _ARCHIVE.format(delete=delete) if state == "failed" else delete
        params = {"queue": queue, "state": state, "count": count, "age": age}
        removed += session.execute(text(statement), params).rowcount or 0
    return removed


def on_finished(session: Session, job: ClaimedJob | Any, state: str) -> None:
    """Release the job's dedup claim now; trim the queue once this transaction commits.

    Trimming inside the finishing transaction would not see jobs finishing
    concurrently (their rows are not committed yet), and two last jobs could
    each leave one record too many. After the commit every finish is visible.
    """
    dedup.release(session, job.id)
    key = "removeOnComplete" if state == "completed" else "removeOnFail"
    setting = job.opts.get(key)
    if retention(setting) is None:
        return
    queue = job.queue

    def trim_committed(_session: Session) -> None:
        try:
            with transaction() as fresh:
                trim(fresh, queue, state, setting)
        except Exception:  # retention is best effort; the next finish trims again
            log.warning("could not trim %s records of %s", state, queue, exc_info=True)

    event.listen(session, "after_commit", trim_committed, once=True)
