"""The job record: Postgres is the system of record for every job.

A row is committed before its message is published, so the records always
hold every job the API accepted; the broker only carries the wake-up call.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tasks.platform.db import Base


class State(StrEnum):
    """A job's state (BullMQ's names). Stored as text; the table's CHECK lists the same."""

    WAITING = "waiting"
    ACTIVE = "active"
    DELAYED = "delayed"
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING_CHILDREN = "waiting-children"
    CANCELLED = "cancelled"


STATES = tuple(State)
# Final: nothing moves a job out of these but an operator's retry (failed only).
FINISHED_STATES = (State.COMPLETED, State.FAILED, State.CANCELLED)
LIVE_STATES = (State.WAITING, State.ACTIVE, State.DELAYED, State.WAITING_CHILDREN)
# What a cancel (or Celery's revoke) may stop: a job that has not started a run.
CANCELLABLE_STATES = (State.WAITING, State.DELAYED, State.WAITING_CHILDREN)


class JobRecord(Base):
    """One job: its data, options, owner, lifecycle and counters."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    queue: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
    opts: Mapped[dict[str, Any]] = mapped_column(JSONB)
    # Options added since the record format (``JobOptions.columns``); the previous release
    # neither writes nor reads it.
    extra_opts: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    tenant_id: Mapped[str | None] = mapped_column(String(200))
    user_id: Mapped[str | None] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(20))
    progress: Mapped[Any | None] = mapped_column(JSONB)
    attempts_made: Mapped[int] = mapped_column(Integer, server_default="0")
    attempts_started: Mapped[int] = mapped_column(Integer, server_default="0")
    stalled_count: Mapped[int] = mapped_column(Integer, server_default="0")
    failed_reason: Mapped[str | None] = mapped_column(Text)
    stacktrace: Mapped[list[str]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    result: Mapped[Any | None] = mapped_column(JSONB)
    runs: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    processed_on: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_on: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    celery_ctx: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    lock_token: Mapped[str | None] = mapped_column(String(64))
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The layout of this record (``tasks.jobs.model.formats``): inserts leave it to the default.
    format: Mapped[int] = mapped_column(SmallInteger, server_default="1")
    # Its rank among its party's jobs on its queue, 0 first: a call's ``priority=``
    # (``tasks.jobs.intake.tenancy.rank``).
    priority: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    # When an owner or operator asked to abort its running run (``tasks.jobs.end.abort``);
    # set only while the job is active, cleared by a retry.
    abort_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The job that added this one as its child (``job.add_child``), woken by its end (0020).
    parent_job_id: Mapped[str | None] = mapped_column(String(200))
    # Another job waits for this one's end (``Defer(waiting_for=...)``, ``job_waits``; 0022).
    awaited: Mapped[bool | None] = mapped_column(Boolean)
    # A caller waits on its result (``AsyncResult.get()``): its success is told on Celery's
    # result channel (``tasks.jobs.observe.results.read``, ``tasks.jobs.end.finish``; 0034).
    watched: Mapped[bool | None] = mapped_column(Boolean)

    __table_args__ = (
        CheckConstraint(
            "state IN ('waiting','active','delayed','completed','failed','waiting-children',"
            "'cancelled')",
            name="state",
        ),
        Index("ix_jobs_queue_state", "queue", "state"),
        Index(
            "ix_jobs_due",
            "run_at",
            postgresql_where=text("state IN ('delayed', 'waiting-children')"),
        ),
        Index(
            "ix_jobs_finished",
            "queue",
            "tenant_id",
            "state",
            "finished_on",
            postgresql_where=text("state IN ('completed','failed','cancelled')"),
        ),
        # The default retention's sweep (tasks.jobs.upkeep.retention): finished records whose
        # job sets no rule of its own, oldest first (migration 0011).
        Index(
            "ix_jobs_expiring_completed",
            "finished_on",
            postgresql_where=text("state = 'completed' AND NOT (opts ? 'removeOnComplete')"),
        ),
        Index(
            "ix_jobs_expiring_ended",
            "state",
            "finished_on",
            postgresql_where=text(
                "state IN ('failed', 'cancelled') AND NOT (opts ? 'removeOnFail')"
            ),
        ),
        # The age of each queue's oldest waiting job (/metrics), read as a min (0012).
        Index(
            "ix_jobs_waiting_since",
            "queue",
            text("COALESCE(run_at, created_at)"),
            postgresql_where=text("state = 'waiting'"),
        ),
        # A party's jobs ahead of a new one on its queue, by rank (its broker priority, 0016).
        Index(
            "ix_jobs_party_ahead",
            "tenant_id",
            "queue",
            "priority",
            postgresql_where=text("state IN ('waiting', 'active')"),
        ),
        Index(
            "ix_jobs_tenant_live",
            "tenant_id",
            "queue",
            "state",
            postgresql_where=text("state IN ('waiting', 'active', 'delayed', 'waiting-children')"),
        ),
        # Listings, newest first by (created_at, id): a user's jobs, a tenant's jobs.
        Index("ix_jobs_owner", "tenant_id", "user_id", "created_at", "id"),
        Index("ix_jobs_tenant_created", "tenant_id", "created_at", "id"),
        # A tenant's failed or cancelled jobs, newest first: a listing filtered by such a
        # state does not walk the tenant's history (0023).
        Index(
            "ix_jobs_tenant_ended",
            "tenant_id",
            "state",
            "created_at",
            "id",
            postgresql_where=text("state IN ('failed', 'cancelled')"),
        ),
        Index("ix_jobs_lock", "locked_until", postgresql_where=text("state = 'active'")),
        # A search by fields of the data, ``data @> '{...}'`` (0026).
        Index(
            "ix_jobs_data",
            "data",
            postgresql_using="gin",
            postgresql_ops={"data": "jsonb_path_ops"},
        ),
        # The runs being aborted, read by every worker's maintenance (0017).
        Index(
            "ix_jobs_aborting",
            "abort_requested_at",
            postgresql_where=text("abort_requested_at IS NOT NULL AND state = 'active'"),
        ),
        # A parent's children, read when one of them ends (0020).
        Index(
            "ix_jobs_parent_job",
            "parent_job_id",
            postgresql_where=text("parent_job_id IS NOT NULL"),
        ),
    )


class WebhookEndpoint(Base):
    """Where a tenant's job events are posted (``tasks.jobs.model.webhooks``): its URL, the
    event types it takes, and the secret its deliveries are signed with. Each delivery is a
    job of its own (``keel.webhook.deliver``), retried with backoff like any other."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSONB)
    secret: Mapped[str] = mapped_column(String(200))
    description: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (Index("ix_webhook_endpoints_tenant", "tenant_id", "created_at"),)


class DedupClaim(Base):
    """Which job holds a deduplication id (BullMQ's ``de:<id>`` key, durable).

    ``expires_at`` NULL means "until the job completes or fails" (simple
    mode); otherwise the claim lapses at that time (throttle / debounce).
    """

    __tablename__ = "dedup_claims"

    queue: Mapped[str] = mapped_column(String(100), primary_key=True)
    dedup_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(200), index=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RetryAudit(Base):
    """Append-only record of a manual retry: what it cleared, who asked and why.

    The database itself refuses UPDATE, DELETE and TRUNCATE on this table.
    """

    __tablename__ = "job_retry_audit"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(200), index=True)
    queue: Mapped[str] = mapped_column(String(100))
    job_name: Mapped[str] = mapped_column(String(200))
    tenant_id: Mapped[str | None] = mapped_column(String(200))
    owner_id: Mapped[str | None] = mapped_column(String(200))
    ids: Mapped[dict[str, Any]] = mapped_column(JSONB)
    failed_reason: Mapped[str | None] = mapped_column(Text)
    stacktrace: Mapped[list[str]] = mapped_column(JSONB)
    attempts_made: Mapped[int] = mapped_column(Integer)
    attempts_started: Mapped[int] = mapped_column(Integer)
    retried_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class JobAction(Base):
    """Append-only record of an operator's edit of one job (``tasks.jobs.intake.edits``):
    its data replaced, its delay changed, promoted. The database refuses UPDATE, DELETE
    and TRUNCATE on this table; rows outlive their job."""

    __tablename__ = "job_actions"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(200), index=True)
    tenant_id: Mapped[str | None] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(50))
    actor: Mapped[str] = mapped_column(String(200))
    details: Mapped[dict[str, Any]] = mapped_column(JSONB)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class ArchivedJob(Base):
    """A failed job record trimmed by retention, kept so operators can still read why."""

    __tablename__ = "failed_jobs_archive"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    queue: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
    opts: Mapped[dict[str, Any]] = mapped_column(JSONB)
    tenant_id: Mapped[str | None] = mapped_column(String(200))
    user_id: Mapped[str | None] = mapped_column(String(200))
    attempts_made: Mapped[int] = mapped_column(Integer)
    attempts_started: Mapped[int] = mapped_column(Integer)
    failed_reason: Mapped[str | None] = mapped_column(Text)
    stacktrace: Mapped[list[str]] = mapped_column(JSONB)
    runs: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_on: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    archived_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class JobSchedulerRecord(Base):
    """A job scheduler (BullMQ's ``upsertJobScheduler``): a stable id, a rule, a job template.

    ``tenant_id`` is ``""`` for system schedulers (managed by the CLI and at
    startup); API schedulers belong to the operator's tenant.
    """

    __tablename__ = "job_schedulers"

    tenant_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    queue: Mapped[str] = mapped_column(String(100))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    # Its template's options added since the record format (``JobOptions.columns``, 0021).
    extra_opts: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Its policies (overlap, catch-up, jitter, paused: ``schedule_rules.Policy``, 0027);
    # null: the defaults. Apart from ``spec``, which the previous release parses strictly.
    policy: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_by: Mapped[str | None] = mapped_column(String(200))
    iteration_count: Mapped[int] = mapped_column(Integer, server_default="0")
    next_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Since when its due slot is held by ``overlap: buffer`` (its last job live), 0032; null:
    # not held. Held slots are looked at after every other due one (``firing.fire_due``).
    held_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        Index(
            "ix_job_schedulers_due", "next_run_at", postgresql_where=text("next_run_at IS NOT NULL")
        ),
    )


class JobCount(Base):
    """Compacted job counts per queue, tenant (``""``: system jobs) and state.

    See ``tasks.jobs.store.counts``.
    """

    __tablename__ = "job_counts"

    queue: Mapped[str] = mapped_column(String(100), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(200), primary_key=True, server_default="")
    state: Mapped[str] = mapped_column(String(20), primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger, server_default="0")


class JobCountDelta(Base):
    """State changes not yet folded into ``job_counts``; written by a trigger, insert-only."""

    __tablename__ = "job_count_deltas"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    queue: Mapped[str] = mapped_column(String(100), index=True)
    tenant_id: Mapped[str] = mapped_column(String(200), server_default="")
    state: Mapped[str] = mapped_column(String(20))
    n: Mapped[int] = mapped_column(Integer)
    # A run's end (into completed or failed), on its ``+1`` row: when, and its wait and run
    # times, for the queue history (``tasks.jobs.store.stats``) folded with the counts.
    finished_on: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    wait_ms: Mapped[int | None] = mapped_column(BigInteger)
    run_ms: Mapped[int | None] = mapped_column(BigInteger)


class JobStat(Base):
    """A queue's finished runs of one tenant (``""``: system jobs) in one bucket of
    ``step_s`` seconds starting at ``bucket``: the history behind the dashboard's charts.

    See ``tasks.jobs.store.stats`` (filled as counts are compacted, kept for a bounded time).
    """

    __tablename__ = "job_stats"

    tenant_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    step_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    queue: Mapped[str] = mapped_column(String(100), primary_key=True)
    completed: Mapped[int] = mapped_column(Integer, server_default="0")
    failed: Mapped[int] = mapped_column(Integer, server_default="0")
    timed: Mapped[int] = mapped_column(Integer, server_default="0")
    wait_ms_sum: Mapped[int] = mapped_column(BigInteger, server_default="0")
    wait_ms_max: Mapped[int] = mapped_column(BigInteger, server_default="0")
    run_ms_sum: Mapped[int] = mapped_column(BigInteger, server_default="0")
    run_ms_max: Mapped[int] = mapped_column(BigInteger, server_default="0")

    __table_args__ = (Index("ix_job_stats_expiry", "step_s", "bucket"),)


class QueuePause(Base):
    """A paused queue (BullMQ's ``queue.pause()``), durable: for every tenant
    (``tenant_id`` ``""``, the CLI's system scope) or for one tenant's jobs on it.

    See ``tasks.jobs.intake.pauses``.
    """

    __tablename__ = "queue_pauses"

    queue: Mapped[str] = mapped_column(String(100), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(200), primary_key=True, server_default="")
    paused_by: Mapped[str | None] = mapped_column(String(200))
    paused_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class JobLogLine(Base):
    """A line a handler wrote with ``job.log()`` / ``self.log()`` (``tasks.jobs.store.logs``):
    numbered from 1 per job, the newest ``KEEL_JOB_LOG_LINES`` kept, deleted with the job."""

    __tablename__ = "job_logs"

    job_id: Mapped[str] = mapped_column(
        String(200), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    logged_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    message: Mapped[str] = mapped_column(Text)


class JobWait(Base):
    """A deferred job (``waiter_id``) waits for ``awaited_id`` to end
    (``Defer(..., waiting_for=[...])``, ``tasks.jobs.store.waits``); deleted with the waiter."""

    __tablename__ = "job_waits"

    awaited_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    waiter_id: Mapped[str] = mapped_column(
        String(200), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )

    __table_args__ = (Index("ix_job_waits_waiter", "waiter_id"),)


class HeldJob(Base):
    """A waiting job a worker set aside because its queue was paused: its message was
    acknowledged, and it is published again when the pause is lifted."""

    __tablename__ = "held_jobs"

    job_id: Mapped[str] = mapped_column(
        String(200), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    queue: Mapped[str] = mapped_column(String(100))
    tenant_id: Mapped[str] = mapped_column(String(200), server_default="")
    held_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (Index("ix_held_jobs_queue", "queue", "tenant_id"),)


class BulkAction(Base):
    """An operator's action on every job a filter matches (``tasks.jobs.upkeep.bulk_actions``):
    its audit (who, why, what, how many) and its progress, worked in batches."""

    __tablename__ = "bulk_actions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    action: Mapped[str] = mapped_column(String(20))
    tenant_id: Mapped[str | None] = mapped_column(String(200))  # None: the system's scope
    filter: Mapped[dict[str, Any]] = mapped_column(JSONB)
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(20))
    matched: Mapped[int] = mapped_column(Integer)
    done: Mapped[int] = mapped_column(Integer, server_default="0")
    cursor: Mapped[str] = mapped_column(String(200), server_default="")  # the last job id done
    worked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        CheckConstraint("state IN ('running', 'done')", name="bulk_state"),
        Index("ix_bulk_actions_running", "worked_at", postgresql_where=text("state = 'running'")),
        Index("ix_bulk_actions_tenant", "tenant_id", "created_at"),
    )


class IdempotencyKey(Base):
    """A creating API request sent with an ``Idempotency-Key`` (``web.idempotency``): the
    user's key, what the request was (``fingerprint``), and, once it succeeded, its answer,
    replayed to a request sent again with the same key until ``expires_at``."""

    __tablename__ = "idempotency_keys"

    tenant_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    status: Mapped[int | None] = mapped_column(Integer)  # None: the first request still runs
    response: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    claimed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_idempotency_keys_expires_at", "expires_at"),)


class QueueLimitOverride(Base):
    """A queue's limits set live (``tasks.jobs.run.live_limits``): ``limits`` holds the fields
    set (``concurrency``, ``rate``; a null one: unlimited), each replacing that field of the
    queue's ``KEEL_QUEUE_LIMITS`` default; deleted, the default is in force again."""

    __tablename__ = "queue_limits"

    queue: Mapped[str] = mapped_column(String(100), primary_key=True)
    limits: Mapped[dict[str, Any]] = mapped_column(JSONB)
    set_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    set_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class QueueLimitChange(Base):
    """Append-only record of a queue's live limits set or cleared: who, why, the override
    before and after (null: none). The database refuses UPDATE, DELETE and TRUNCATE."""

    __tablename__ = "queue_limit_changes"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    queue: Mapped[str] = mapped_column(String(100))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    __table_args__ = (Index("ix_queue_limit_changes_queue", "queue", "id"),)


class KeyLimitOverride(Base):
    """A job type's key limits overridden live (``tasks.jobs.run.live_key_limits``), for the
    keys of one tenant (or every tenant's: ``*``) that ``key_pattern`` matches (one key, or a
    pattern with ``*``): ``limits`` holds the fields given (``max_running``, ``rate``; a null
    one: no such limit), each replacing what the job type declares."""

    __tablename__ = "key_limit_overrides"

    job_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    key_pattern: Mapped[str] = mapped_column(String(200), primary_key=True)
    limits: Mapped[dict[str, Any]] = mapped_column(JSONB)
    set_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    set_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class KeyLimitChange(Base):
    """Append-only record of a key limit override set or cleared: who, why, the override
    before and after (null: none). The database refuses UPDATE, DELETE and TRUNCATE."""

    __tablename__ = "key_limit_changes"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_name: Mapped[str] = mapped_column(String(200))
    tenant: Mapped[str] = mapped_column(String(200))
    key_pattern: Mapped[str] = mapped_column(String(200))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    __table_args__ = (Index("ix_key_limit_changes_job_name", "job_name", "id"),)


class PlatformView(Base):
    """Append-only record of a page a platform session read (``web.ui.platform``): who, which
    view, the path with its query, when. Every tenant's records are on those pages, so each
    read is kept. The database refuses UPDATE, DELETE and TRUNCATE."""

    __tablename__ = "platform_views"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    actor: Mapped[str] = mapped_column(String(200))
    view: Mapped[str] = mapped_column(String(100))
    path: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    __table_args__ = (Index("ix_platform_views_actor", "actor", "id"),)
