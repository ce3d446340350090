"""The SQL of bulk actions: the jobs a filter matches, a batch at a time, and the action's row.

A bulk action's filter (``BulkFilter``) becomes one WHERE clause with bound parameters;
what the action may touch (its states, and only jobs that were there when it was asked:
created, or finished, before it started) is added by the action (``Action``). The batches
walk the matching jobs in id order from the action's cursor (the last id a batch did), so
each job is visited once, even one that comes back into the filter after its batch (a
promoted job parked again, a cancelled one retried); the walk costs one pass over the
matching rows, whatever the batch size. A batch locks its rows, waiting at most
``LOCK_WAIT_MS`` for one another transaction holds (a claim, the promoter): past that it
fails and is tried again, rather than skipping the row. Callers own the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.model.models import BulkAction, State
from tasks.jobs.store.jobs import ReadyJob, ready_job
from tasks.jobs.store.upkeep import ARCHIVE_DELETED
from tasks.platform.db import affected

BATCH = 500  # rows a batch locks and changes: its transaction is short whatever the total
LOCK_WAIT_MS = 2000  # a batch waits this long at most for a row another transaction holds


@dataclass(frozen=True)
class BulkFilter:
    """Which jobs: every field given must hold (``tenant_id`` ``None``: any tenant's, the
    system's scope; a tenant operator's filter always names its tenant)."""

    states: tuple[State, ...]
    queue: str | None = None
    name: str | None = None
    tenant_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_before: datetime | None = None

    def where(self, started_at: datetime, since: str) -> tuple[str, dict[str, Any]]:
        """The clause and its parameters; ``since`` names the column that must predate
        ``started_at`` (``created_at`` or ``finished_on``)."""
        clauses = ["state = ANY(:states)", f"{since} <= :started_at"]
        params: dict[str, Any] = {"states": [str(s) for s in self.states], "started_at": started_at}
        for column, value, op in (
            ("queue", self.queue, "="),
            ("name", self.name, "="),
            ("tenant_id", self.tenant_id, "="),
            ("created_at", self.created_after, ">="),
            ("created_at", self.created_before, "<"),
            ("finished_on", self.finished_before, "<"),
        ):
            if value is not None:
                key = f"p{len(params)}"
                clauses.append(f"{column} {op} :{key}")
                params[key] = value
        return " AND ".join(clauses), params


def count(session: Session, where: str, params: dict[str, Any]) -> int:
    query = text(f"SELECT count(*) FROM jobs WHERE {where}")
    return int(session.execute(query, params).scalar_one())


def lock_batch(
    session: Session, where: str, params: dict[str, Any], after: str, limit: int
) -> list[str]:
    """The next ``limit`` matching jobs after id ``after``, in id order, their rows locked;
    none left: ``[]``."""
    session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_WAIT_MS}ms'"))
    rows = session.execute(
        text(
            f"SELECT id FROM jobs WHERE {where} AND id > :after ORDER BY id LIMIT :limit FOR UPDATE"
        ),
        {**params, "after": after, "limit": limit},
    )
    return [row.id for row in rows]


# --- what each action does to a locked batch --------------------------------------------------

_RETRY = text(
    """
    UPDATE jobs SET state = 'waiting', attempts_made = 0, attempts_started = 0,
        stalled_count = 0, failed_reason = NULL, stacktrace = '[]'::jsonb,
        result = NULL, progress = NULL, processed_on = NULL, finished_on = NULL,
        lock_token = NULL, locked_until = NULL, abort_requested_at = NULL,
        runs = runs || jsonb_build_array(jsonb_build_object('outcome', 'manual-retry',
                                                            'bulkAction', CAST(:bulk AS text)))
    WHERE id = ANY(:ids) AND state = 'failed'
    RETURNING id, name, queue, data, celery_ctx, tenant_id, priority
    """
)


# What a manual retry's audit row keeps (``job_retry_audit``), for each job of the batch,
# copied before the reset clears it.
_RETRY_AUDIT = text(
    """
    INSERT INTO job_retry_audit (job_id, queue, job_name, tenant_id, owner_id, ids,
        failed_reason, stacktrace, attempts_made, attempts_started, retried_by, reason)
    SELECT id, queue, name, tenant_id, user_id,
           jsonb_build_object('jobId', id, 'name', name, 'bulkAction', CAST(:bulk AS text)),
           failed_reason, stacktrace, attempts_made, attempts_started, :actor, :reason
    FROM jobs WHERE id = ANY(:ids) AND state = 'failed'
    """
)


def retry(
    session: Session, job_ids: list[str], bulk_id: str, actor: str, reason: str
) -> list[ReadyJob]:
    """Failed jobs → waiting with their attempts again, each audited first as a manual
    retry is (the caller publishes them)."""
    params = {"ids": job_ids, "bulk": bulk_id}
    session.execute(_RETRY_AUDIT, {**params, "actor": actor, "reason": reason})
    return [ready_job(r) for r in session.execute(_RETRY, params)]


def clean(session: Session, job_ids: list[str]) -> int:
    """Delete finished records; failed ones are copied to the archive by the same statement."""
    removed = 0
    for state in (State.COMPLETED, State.CANCELLED):
        removed += affected(
            session.execute(
                text("DELETE FROM jobs WHERE id = ANY(:ids) AND state = :state"),
                {"ids": job_ids, "state": state},
            )
        )
    delete = "DELETE FROM jobs WHERE id = ANY(:ids) AND state = 'failed'"
    archived = text(ARCHIVE_DELETED.format(delete=delete))
    removed += affected(session.execute(archived, {"ids": job_ids}))
    return removed


def obliterate(session: Session, job_ids: list[str]) -> int:
    """Delete the records of a queue's jobs, whatever their state but active, with their
    deduplication claims (their logs and holds go with them)."""
    session.execute(text("DELETE FROM dedup_claims WHERE job_id = ANY(:ids)"), {"ids": job_ids})
    return affected(
        session.execute(
            text("DELETE FROM jobs WHERE id = ANY(:ids) AND state <> 'active'"), {"ids": job_ids}
        )
    )


def active_on(session: Session, queue: str) -> int:
    row = session.execute(
        text("SELECT count(*) FROM jobs WHERE queue = :queue AND state = 'active'"),
        {"queue": queue},
    )
    return int(row.scalar_one())


# --- the action's row ---------------------------------------------------------------------------


def add(session: Session, action: BulkAction) -> BulkAction:
    session.add(action)
    session.flush()
    session.refresh(action)  # its created_at, the moment that bounds what it touches
    return action


def get(session: Session, bulk_id: str) -> BulkAction | None:
    return session.get(BulkAction, bulk_id)


def lock_running(session: Session, bulk_id: str | None = None) -> BulkAction | None:
    """A running action no one else is working on (``bulk_id``: that one), its row locked
    until the transaction ends, the one worked least recently first (an action that keeps
    failing waits its turn behind the others); ``None`` if there is none free."""
    query = "SELECT id FROM bulk_actions WHERE state = 'running'"
    params: dict[str, Any] = {}
    if bulk_id is not None:
        query += " AND id = :id"
        params["id"] = bulk_id
    row = session.execute(
        text(f"{query} ORDER BY worked_at NULLS FIRST LIMIT 1 FOR UPDATE SKIP LOCKED"), params
    ).first()
    return session.get(BulkAction, row.id) if row is not None else None


def advance(
    session: Session, action: BulkAction, done: int, cursor: str | None, *, finished: bool
) -> None:
    """A batch's count and the last id it did (``None``: the walk is over), with its jobs."""
    session.execute(
        text(
            "UPDATE bulk_actions SET done = done + :n, cursor = COALESCE(:cursor, cursor), "
            "worked_at = clock_timestamp(), last_error = NULL, "
            "state = CASE WHEN :finished THEN 'done' ELSE state END, "
            "finished_at = CASE WHEN :finished THEN clock_timestamp() END "
            "WHERE id = :id"
        ),
        {"id": action.id, "n": done, "cursor": cursor, "finished": finished},
    )


def note_failure(session: Session, bulk_id: str, error: str) -> None:
    """A batch failed (rolled back): said on the action, which waits its turn again."""
    session.execute(
        text(
            "UPDATE bulk_actions SET worked_at = clock_timestamp(), last_error = :error "
            "WHERE id = :id AND state = 'running'"
        ),
        {"id": bulk_id, "error": error[:2000]},
    )
