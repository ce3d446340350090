"""What happens, in the same transaction, when a job reaches completed or failed.

The job's simple-mode deduplication claim is released. Retention follows
BullMQ's ``removeOnComplete`` / ``removeOnFail``: the finishing job's
setting trims finished records of the same kind, lazily, at the moment
another job finishes. A failed record is copied to the failure archive in
the same statement that trims it.

The count is kept per (queue, tenant), and per job name for system jobs
(no tenant): a queue is shared, and one tenant's traffic must never push
another tenant's finished records out (nor a busy system job another's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Partition:
    """Whose finished records a retention setting counts: a tenant's, or one system job's."""

    queue: str
    tenant_id: str | None
    name: str

    @classmethod
    def of(cls, job: Any) -> Partition:
        return cls(job.queue, job.tenant_id, job.name)

    @property
    def where(self) -> str:
        if self.tenant_id is not None:
            return "queue = :queue AND tenant_id = :tenant AND state = :state"
        return "queue = :queue AND tenant_id IS NULL AND name = :name AND state = :state"


def trim(session: Session, partition: Partition, state: str, setting: Any) -> int:
    """Delete the partition's finished records beyond the newest ``count`` or older than ``age``."""
    keep = retention(setting)
    if keep is None:
        return 0
    count, age = keep
    where = partition.where
    deletes = []
    if count is not None:
        deletes.append(
            f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE {where} "
            "ORDER BY finished_on DESC OFFSET :count FOR UPDATE SKIP LOCKED)"
        )
    if age is not None:
        deletes.append(
            f"DELETE FROM jobs WHERE {where} "
            "AND finished_on < clock_timestamp() - make_interval(secs => :age)"
        )
    removed = 0
    params = {"queue": partition.queue, "tenant": partition.tenant_id, "name": partition.name,
              "state": state, "count": count, "age": age}  # fmt: skip
    for delete in deletes:
        statement = _ARCHIVE.format(delete=delete) if state == "failed" else delete
        removed += session.execute(text(statement), params).rowcount or 0
    return removed


def on_finished(session: Session, job: ClaimedJob | Any, state: str) -> None:
    """Release the job's dedup claim now; trim its partition once this transaction commits.

    Trimming inside the finishing transaction would not see jobs finishing
    concurrently (their rows are not committed yet), and two last jobs could
    each leave one record too many. After the commit every finish is visible.
    """
    dedup.release(session, job.id)
    key = "removeOnComplete" if state == "completed" else "removeOnFail"
    setting = job.opts.get(key)
    if retention(setting) is None:
        return
    partition = Partition.of(job)

    def trim_committed(_session: Session) -> None:
        try:
            with transaction() as fresh:
                trim(fresh, partition, state, setting)
        except Exception:  # retention is best effort; the next finish trims again
            log.warning("could not trim %s records of %s", state, partition, exc_info=True)

    event.listen(session, "after_commit", trim_committed, once=True)
