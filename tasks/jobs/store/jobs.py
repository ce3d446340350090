"""The ``jobs`` table's records: adding them, cancelling them, an operator's reads and retries.

A job's runs (claim, progress, completion, failure) are ``runs``; what the
workers' maintenance and the reconciler do to many records at once is
``upkeep``. Callers own the transaction (``with transaction() as session``)
and pass the session in; the ``*_alone`` forms of an add are their own
statement, sent without a Session (``tasks.platform.db.run_alone``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exists, select, text
from sqlalchemy.orm import Session

from tasks.jobs.model.models import JobAction, JobRecord, RetryAudit, State
from tasks.jobs.model.options import JobOptions
from tasks.platform.db import run_alone


@dataclass(frozen=True)
class Job:
    """A job as it travels between the store and the lifecycle: who, what, where."""

    id: str
    name: str
    queue: str
    data: dict[str, Any]
    tenant_id: str | None


@dataclass(frozen=True)
class NewJob(Job):
    """A job about to be recorded."""

    user_id: str | None
    opts: JobOptions
    # Its rank among its party's jobs on the queue, 0 first: no default, since "none given"
    # is a rank that depends on the broker (``tasks.jobs.intake.tenancy.rank``).
    priority: int
    celery_ctx: dict[str, Any] | None = None
    waiting_children: bool = False  # a chord's body: waits (no due time) for its parts
    parent_job_id: str | None = None  # the running job that added it (``job.add_child``)

    @property
    def state(self) -> State:
        if self.waiting_children:
            return State.WAITING_CHILDREN
        return State.DELAYED if self.opts.delay > 0 else State.WAITING


@dataclass(frozen=True)
class ReadyJob(Job):
    """A job that just became waiting and needs its message (promoted, requeued, listed)."""

    celery_ctx: dict[str, Any] | None = None
    state: State = State.WAITING
    opts: dict[str, Any] | None = None
    priority: int = 0  # its rank among its party's jobs on the queue, 0 first


def ready_job(row: Any, **more: Any) -> ReadyJob:
    return ReadyJob(
        id=row.id,
        name=row.name,
        queue=row.queue,
        data=row.data,
        tenant_id=row.tenant_id,
        celery_ctx=row.celery_ctx,
        priority=row.priority,
        **more,
    )


# --- adding ---------------------------------------------------------------------------------

_INSERT_ONE = """
    INSERT INTO jobs (id, queue, name, data, opts, extra_opts, tenant_id, user_id, state,
                      celery_ctx, priority, run_at, parent_job_id)
    VALUES (:id, :queue, :name, CAST(:data AS jsonb), CAST(:opts AS jsonb), CAST(:extra AS jsonb),
            :tenant_id, :user_id, :state, CAST(:ctx AS jsonb), :priority,
            CASE WHEN :delay_ms > 0
                 THEN clock_timestamp() + make_interval(secs => CAST(:delay_ms AS float) / 1000)
                 END, :parent)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
"""
_INSERT = text(_INSERT_ONE)
# The insert, and (in the same statement, from its snapshot: without the new job) how
# many jobs its party has running or waiting on its queue — what places it among the
# queue's priorities (``tasks.jobs.intake.tenancy``).
_INSERT_COUNTING = """
    WITH load AS (SELECT count(*) AS on_queue FROM (
                      SELECT 1 FROM jobs
                      WHERE {party} AND queue = :queue AND state IN ('waiting', 'active')
                        AND priority <= :priority
                      LIMIT :up_to) AS ahead),
         added AS ({insert})
    SELECT (SELECT id FROM added) AS id, (SELECT on_queue FROM load) AS on_queue
"""


def row_of(job: NewJob) -> dict[str, Any]:
    """The parameters of ``job``'s insert."""
    opts, extra = job.opts.columns()
    return {
        "id": job.id,
        "queue": job.queue,
        "name": job.name,
        "data": json.dumps(job.data),
        "opts": json.dumps(opts),
        "extra": json.dumps(extra) if extra else None,
        "tenant_id": job.tenant_id,
        "user_id": job.user_id,
        "state": job.state,
        "ctx": json.dumps(job.celery_ctx) if job.celery_ctx else None,
        "delay_ms": job.opts.delay,
        "priority": job.priority,
        "parent": job.parent_job_id,
    }


def insert(session: Session, job: NewJob) -> bool:
    """Record ``job``; ``False`` if a job with its id exists (nothing is changed)."""
    return session.execute(_INSERT, row_of(job)).first() is not None


# Built once (an add is the hot path): the system's jobs' party, and a tenant's.
_INSERT_COUNTING_BY_PARTY = {
    system: text(
        _INSERT_COUNTING.format(
            party="tenant_id IS NULL" if system else "tenant_id = :tenant_id", insert=_INSERT_ONE
        )
    )
    for system in (True, False)
}


def insert_counting(session: Session, job: NewJob, up_to: int) -> tuple[bool, int]:
    """``insert``, in the same statement counting the jobs its party (tenant, or the system's
    jobs) has waiting or active on its queue, up to ``up_to`` (a count that stops there
    costs the same with a million waiting): ``(created, on_queue)``."""
    statement = _INSERT_COUNTING_BY_PARTY[job.tenant_id is None]
    row = session.execute(statement, {**row_of(job), "up_to": up_to}).one()
    return row.id is not None, int(row.on_queue)


def insert_alone(job: NewJob) -> bool:
    """``insert`` as its own statement, without a Session (``tasks.platform.db.run_alone``)."""
    return run_alone(_INSERT, row_of(job)) is not None


def insert_counting_alone(job: NewJob, up_to: int) -> tuple[bool, int]:
    """``insert_counting`` as its own statement, without a Session
    (``tasks.platform.db.run_alone``):
    an add with no dedup rule and no quota, such as a Celery ``.delay()``."""
    statement = _INSERT_COUNTING_BY_PARTY[job.tenant_id is None]
    row = run_alone(statement, {**row_of(job), "up_to": up_to})
    assert row is not None  # the statement returns one row
    return row["id"] is not None, int(row["on_queue"])


_INSERT_MANY = text(
    """
    INSERT INTO jobs (id, queue, name, data, opts, extra_opts, tenant_id, user_id, state,
                      celery_ctx, priority, run_at, parent_job_id)
    SELECT r.id, r.queue, r.name, r.data, r.opts, r.extra, r.tenant_id, r.user_id, r.state,
           r.ctx, r.priority, CASE WHEN r.delay_ms > 0
                THEN clock_timestamp() + make_interval(secs => r.delay_ms / 1000.0) END,
           r.parent
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        id text, queue text, name text, data jsonb, opts jsonb, extra jsonb, tenant_id text,
        user_id text, state text, ctx jsonb, delay_ms bigint, priority smallint, parent text)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
    """
)


def insert_many(session: Session, jobs: Sequence[NewJob]) -> set[str]:
    """Record ``jobs`` in one statement; the ids that were new (an existing id changes nothing)."""
    rows = []
    for job in jobs:
        opts, extra = job.opts.columns()
        rows.append(
            {
                "id": job.id,
                "queue": job.queue,
                "name": job.name,
                "data": job.data,
                "opts": opts,
                "extra": extra,
                "tenant_id": job.tenant_id,
                "user_id": job.user_id,
                "state": str(job.state),
                "ctx": job.celery_ctx,
                "delay_ms": job.opts.delay,
                "priority": job.priority,
                "parent": job.parent_job_id,
            }
        )
    found = session.execute(_INSERT_MANY, {"rows": json.dumps(rows)}).scalars()
    return set(found)


def delete_delayed(session: Session, job_id: str) -> bool:
    """Debounce with replace: drop a still-delayed job that a new add replaces."""
    statement = text("DELETE FROM jobs WHERE id = :id AND state = 'delayed' RETURNING id")
    return session.execute(statement, {"id": job_id}).first() is not None


_LOAD = """
    SELECT count(*) AS live,
           count(*) FILTER (WHERE queue = :queue AND state IN ('waiting', 'active')
                            AND priority <= :priority) AS on_queue
    FROM jobs WHERE {party}
      AND state IN ('waiting', 'active', 'delayed', 'waiting-children')
"""


# The insert if the party has fewer than ``max_live`` live jobs, with the party's load, in
# one statement (its snapshot is taken after the caller's quota lock: ``tenancy.admit_insert``).
# The insert of ``row_of(job)``'s job, one row selected ``FROM {source} WHERE {condition}``
# (inside a statement that decides whether it may be added).
INSERT_IF = """
    INSERT INTO jobs (id, queue, name, data, opts, extra_opts, tenant_id, user_id, state,
                      celery_ctx, priority, run_at, parent_job_id)
    SELECT :id, :queue, :name, CAST(:data AS jsonb), CAST(:opts AS jsonb), CAST(:extra AS jsonb),
           :tenant_id, :user_id, :state, CAST(:ctx AS jsonb), :priority,
           CASE WHEN CAST(:delay_ms AS bigint) > 0
                THEN clock_timestamp() + make_interval(secs => CAST(:delay_ms AS float) / 1000)
                END, :parent
    FROM {source} WHERE {condition}
    ON CONFLICT (id) DO NOTHING
    RETURNING id
"""
_INSERT_WITHIN = """
    WITH load AS ({load}),
         added AS ({insert})
    SELECT (SELECT id FROM added) AS id, load.live, load.on_queue FROM load
"""
_INSERT_WITHIN_BY_PARTY = {
    system: text(
        _INSERT_WITHIN.format(
            load=_LOAD.format(party="tenant_id IS NULL" if system else "tenant_id = :tenant_id"),
            insert=INSERT_IF.format(
                source="load",
                condition="CAST(:max_live AS bigint) IS NULL "
                "OR load.live < CAST(:max_live AS bigint)",
            ),
        )
    )
    for system in (True, False)
}


def insert_within(session: Session, job: NewJob, max_live: int | None) -> tuple[bool, int, int]:
    """``insert`` unless the job's party already has ``max_live`` live jobs (``None``: no
    bound), and the party's load before it, in one statement: ``(created, live, on_queue)``."""
    statement = _INSERT_WITHIN_BY_PARTY[job.tenant_id is None]
    row = session.execute(statement, {**row_of(job), "max_live": max_live}).one()
    return row.id is not None, int(row.live), int(row.on_queue)


def party_load(
    session: Session, tenant_id: str | None, queue: str, priority: int = 0
) -> tuple[int, int]:
    """A tenant's (``None``: the system's) live jobs, and those running or waiting on
    ``queue`` that rank at or before ``priority``."""
    party = "tenant_id IS NULL" if tenant_id is None else "tenant_id = :tenant"
    row = session.execute(
        text(_LOAD.format(party=party)), {"tenant": tenant_id, "queue": queue, "priority": priority}
    ).one()
    return int(row.live), int(row.on_queue)


# --- cancelling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelledJob(Job):
    """A job just cancelled: what finishing it needs (dedup claim, retention by its opts)."""

    opts: dict[str, Any]
    user_id: str | None
    celery_ctx: dict[str, Any] | None = None
    parent_job_id: str | None = None


# Like ``upkeep._PARK``, the state is tested on the row as locked, not in the statement's
# snapshot: a promoter publishes inside its transaction, so the row may be committed as
# waiting (and its message be on its way) after this statement began; the claim then finds
# it cancelled.
# Rows are locked in id order: two workers cancelling the same revoked ids never deadlock.
_CANCEL = text(
    """
    WITH before AS (SELECT id, state FROM jobs WHERE id = ANY(:ids) ORDER BY id FOR UPDATE)
    UPDATE jobs SET state = 'cancelled', finished_on = clock_timestamp(),
        lock_token = NULL, locked_until = NULL
    FROM before WHERE jobs.id = before.id AND before.state = ANY(:states)
    RETURNING jobs.id, jobs.name, jobs.queue, jobs.data, jobs.opts, jobs.tenant_id, jobs.user_id,
        jobs.celery_ctx, jobs.parent_job_id
    """
)


def cancel(session: Session, job_ids: Sequence[str], states: Sequence[State]) -> list[CancelledJob]:
    """Cancel those of ``job_ids`` whose (locked) row is in one of ``states``; the ones it did."""
    if not job_ids:
        return []
    rows = session.execute(_CANCEL, {"ids": list(job_ids), "states": [str(s) for s in states]})
    return [cancelled_job(row) for row in rows]


def cancelled_job(row: Any) -> CancelledJob:
    """A row returned by a statement that cancelled its job (``id, name, queue, data, opts,
    tenant_id, user_id, celery_ctx, parent_job_id``)."""
    return CancelledJob(
        id=row.id,
        name=row.name,
        queue=row.queue,
        data=row.data,
        tenant_id=row.tenant_id,
        opts=row.opts,
        user_id=row.user_id,
        celery_ctx=row.celery_ctx,
        parent_job_id=row.parent_job_id,
    )


# --- operators ------------------------------------------------------------------------------


def lock(session: Session, job_id: str) -> JobRecord | None:
    """The job, its row locked until the transaction ends (concurrent retries queue here)."""
    query = select(JobRecord).where(JobRecord.id == job_id).with_for_update()
    return session.scalars(query).first()


def lock_if_free(session: Session, job_id: str) -> JobRecord | None:
    """The job with its row locked, or ``None`` if it is absent or another transaction
    holds its row (``SKIP LOCKED``: never waits).

    ``FOR NO KEY UPDATE``, the lock an update of its columns takes: a transaction that only
    references the job (a log line's insert takes ``FOR KEY SHARE``) does not count as
    holding it; one that may change it (a claim) or reads it ``FOR SHARE`` (a pause's hold)
    does."""
    query = (
        select(JobRecord)
        .where(JobRecord.id == job_id)
        .with_for_update(skip_locked=True, key_share=True)
    )
    return session.scalars(query).first()


def was_retried(session: Session, job_id: str) -> bool:
    return bool(session.scalar(select(exists().where(RetryAudit.job_id == job_id))))


# The ``job_actions`` row of a job cancelled by Celery's ``revoke`` (``tasks.jobs.end.cancel``).
REVOKED = "revoke"


def note_revoked(session: Session, jobs: Sequence[CancelledJob]) -> None:
    """Audit that these jobs were cancelled by a ``revoke``: the workers remember it."""
    session.add_all(
        JobAction(
            job_id=job.id, tenant_id=job.tenant_id, action=REVOKED, actor="celery", details={}
        )
        for job in jobs
    )


def note_cancelled(
    session: Session, jobs: Sequence[CancelledJob], *, actor: str, reason: str
) -> None:
    """Audit that the system cancelled these jobs, by whom (``actor``) and why."""
    session.add_all(
        JobAction(
            job_id=job.id,
            tenant_id=job.tenant_id,
            action="cancel",
            actor=actor,
            details={"reason": reason},
        )
        for job in jobs
    )


def was_revoked(session: Session, job_id: str) -> bool:
    found = exists().where(JobAction.job_id == job_id, JobAction.action == REVOKED)
    return bool(session.scalar(select(found)))


def record_audit(session: Session, audit: RetryAudit) -> None:
    """The audit row of a manual retry, written (flushed) before anything is cleared."""
    session.add(audit)
    session.flush()


def reset_for_retry(session: Session, job_id: str) -> None:
    """A manual retry: full attempts again, failure fields cleared (audited first)."""
    session.execute(
        text(
            """
            UPDATE jobs SET state = 'waiting', attempts_made = 0, attempts_started = 0,
                stalled_count = 0, failed_reason = NULL, stacktrace = '[]'::jsonb,
                result = NULL, progress = NULL, processed_on = NULL, finished_on = NULL,
                lock_token = NULL, locked_until = NULL, abort_requested_at = NULL,
                runs = runs || jsonb_build_array(jsonb_build_object('outcome', 'manual-retry'))
            WHERE id = :id
            """
        ),
        {"id": job_id},
    )


def get(session: Session, job_id: str) -> JobRecord | None:
    return session.get(JobRecord, job_id)


_FORGET_RESULT = text(
    "UPDATE jobs SET result = NULL WHERE id = :id AND result IS NOT NULL "
    "AND (CAST(:tenant AS text) IS NULL OR tenant_id = :tenant)"
)


def forget_result(session: Session, job_id: str, tenant_id: str | None) -> bool:
    """Drop a job's stored result (the record stays); only ``tenant_id``'s job when given.
    ``False`` when there was no result to drop."""
    done: Any = session.execute(_FORGET_RESULT, {"id": job_id, "tenant": tenant_id})
    return bool(done.rowcount)


# The rows a marking waiter may read come from the UPDATE's RETURNING: their version after
# any completion it waited for, never the statement's older snapshot (a completion that
# committed meanwhile did not see the mark, so the reader must see its end). The rest (marked
# before, which a completion sees; another tenant's) are read as they were.
_READ_WATCHING = """
    WITH marked AS (
        UPDATE jobs SET watched = TRUE
        WHERE id = ANY(:ids) AND watched IS NOT TRUE
          AND (CAST(:tenant AS text) IS NULL OR tenant_id = CAST(:tenant AS text))
        RETURNING {columns}
    )
    SELECT * FROM marked
    UNION ALL
    SELECT {columns} FROM jobs WHERE id = ANY(:ids) AND id NOT IN (SELECT id FROM marked)
"""


def read_watching(
    session: Session, ids: list[str], tenant_id: str | None, columns: str
) -> list[Any]:
    """``columns`` of these jobs, marking those of ``tenant_id`` (every one when ``None``)
    watched: a caller waits on their results (``tasks.jobs.observe.results.read``)."""
    statement = text(_READ_WATCHING.format(columns=columns))
    return list(session.execute(statement, {"ids": ids, "tenant": tenant_id}).all())


def add_action(
    session: Session,
    job_id: str,
    tenant_id: str | None,
    action: str,
    actor: str,
    details: dict[str, Any],
) -> None:
    """Append one row to a job's audit trail (``job_actions``) in the caller's transaction."""
    session.add(
        JobAction(job_id=job_id, tenant_id=tenant_id, action=action, actor=actor, details=details)
    )
