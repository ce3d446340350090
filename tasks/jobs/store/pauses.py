"""The SQL of paused queues and the jobs they hold (``tasks.jobs.intake.pauses``).

A pause is a row of ``queue_pauses``: ``tenant_id`` ``""`` pauses the queue for every
tenant, a tenant's id pauses that tenant's jobs on it. A job held by a pause is a row of
``held_jobs`` beside its (still waiting) record.

The hold and the lifting of a pause are ordered by the pause row's lock: ``hold`` reads it
``FOR SHARE`` in the transaction that notes the job, and ``lift`` deletes it. So either the
hold commits first (and the release that follows the lift sees its row), or the lift does
(and the hold finds no pause: the worker runs the job). No held job is left behind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.store.jobs import ReadyJob, ready_job

ALL_TENANTS = ""


@dataclass(frozen=True)
class Pause:
    queue: str
    tenant_id: str  # "" for every tenant
    paused_by: str | None
    paused_at: datetime


def pause(session: Session, queue: str, tenant_id: str, by: str | None) -> bool:
    """Pause ``queue`` for ``tenant_id`` (``""``: everyone); ``False`` if it was already."""
    row = session.execute(
        text(
            "INSERT INTO queue_pauses (queue, tenant_id, paused_by) VALUES (:queue, :tenant, :by) "
            "ON CONFLICT DO NOTHING RETURNING queue"
        ),
        {"queue": queue, "tenant": tenant_id, "by": by},
    ).first()
    return row is not None


def lift(session: Session, queue: str, tenant_id: str) -> bool:
    """Lift that pause; ``False`` if there was none."""
    row = session.execute(
        text("DELETE FROM queue_pauses WHERE queue = :queue AND tenant_id = :tenant RETURNING 1"),
        {"queue": queue, "tenant": tenant_id},
    ).first()
    return row is not None


def pauses(session: Session, tenant_id: str | None = None) -> list[Pause]:
    """Every pause (``tenant_id`` given: those that hold that tenant's jobs), by queue."""
    where = "" if tenant_id is None else "WHERE tenant_id IN ('', :tenant)"
    rows = session.execute(
        text(
            f"SELECT queue, tenant_id, paused_by, paused_at FROM queue_pauses {where} "
            "ORDER BY queue, tenant_id"
        ),
        {"tenant": tenant_id},
    ).all()
    return [Pause(r.queue, r.tenant_id, r.paused_by, r.paused_at) for r in rows]


def paused_queues(session: Session) -> set[str]:
    """The queues with a pause of any scope (what a worker checks before a claim)."""
    return set(session.execute(text("SELECT DISTINCT queue FROM queue_pauses")).scalars())


class Hold(enum.Enum):
    """What ``hold`` found: the delivery is held, is to run, is to be left alone, or has
    no record (yet: the transaction inserting it may still be open)."""

    HELD = "held"
    RUN = "run"
    LEAVE = "leave"
    NO_RECORD = "no_record"


def hold(session: Session, job_id: str) -> Hold:
    """Note the waiting job ``job_id`` as held if a pause covers it now.

    The job's row is read ``FOR SHARE`` first: a transaction that is making it waiting
    (a promotion, a stalled requeue, a retry) publishes before it commits, so its message
    can arrive first, and a snapshot read would see the job delayed and let the claim
    that follows wait for the commit and run it. The lock waits for that commit and reads
    the state it wrote. An uncommitted *insert* is invisible instead (``NO_RECORD``): the
    caller waits for it (``runs.await_insert``) and asks again. An active job whose lock
    expired (its worker died) is ``LEAVE`` under a pause: a claim would start it again;
    the stalled check makes it waiting, and its new message is held. The pause row stays
    share-locked until this commit.
    """
    job = session.execute(
        text(
            "SELECT state, queue, COALESCE(tenant_id, '') AS tenant, "
            "locked_until < clock_timestamp() AS lock_expired FROM jobs "
            "WHERE id = :id FOR SHARE"
        ),
        {"id": job_id},
    ).first()
    if job is None:
        return Hold.NO_RECORD
    if job.state not in ("waiting", "active"):
        return Hold.RUN  # not ours to hold: the claim refuses it
    covered = session.execute(
        text(
            "SELECT 1 FROM queue_pauses WHERE queue = :queue AND tenant_id IN ('', :tenant) "
            "LIMIT 1 FOR SHARE"
        ),
        {"queue": job.queue, "tenant": job.tenant},
    ).first()
    if covered is None:
        return Hold.RUN
    if job.state == "active":
        return Hold.LEAVE if job.lock_expired else Hold.RUN
    session.execute(
        text(
            "INSERT INTO held_jobs (job_id, queue, tenant_id) VALUES (:id, :queue, :tenant) "
            "ON CONFLICT DO NOTHING"
        ),
        {"id": job_id, "queue": job.queue, "tenant": job.tenant},
    )
    return Hold.HELD


def release(
    session: Session, limit: int, queue: str | None = None, tenant_id: str | None = None
) -> tuple[list[ReadyJob], int]:
    """Up to ``limit`` held jobs that no pause covers any more, oldest held first, forgotten
    as held: those still waiting (the caller publishes them), and how many rows were taken
    in all (a job cancelled while held has nothing to publish). ``queue`` (and
    ``tenant_id``, ``""`` meaning every tenant) keeps to the jobs a lifted pause held."""
    scope = ""
    if queue is not None:
        scope = "AND h.queue = :queue"
        if tenant_id:
            scope += " AND h.tenant_id = :tenant"
    taken = session.execute(
        text(
            f"""
            DELETE FROM held_jobs WHERE job_id IN (
                SELECT h.job_id FROM held_jobs h
                WHERE NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = h.queue
                                  AND p.tenant_id IN ('', h.tenant_id)) {scope}
                ORDER BY h.held_at LIMIT :limit FOR UPDATE SKIP LOCKED)
            RETURNING job_id
            """
        ),
        {"limit": limit, "queue": queue, "tenant": tenant_id},
    ).scalars()
    ids = list(taken)
    if not ids:
        return [], 0
    rows = session.execute(
        text(
            "SELECT id, name, queue, data, celery_ctx, tenant_id, priority FROM jobs "
            "WHERE id = ANY(:ids) AND state = 'waiting' ORDER BY created_at"
        ),
        {"ids": ids},
    ).all()
    return [ready_job(r) for r in rows], len(ids)


def held_counts(session: Session) -> dict[str, int]:
    """Held jobs per queue (those still waiting: one cancelled while held is not)."""
    rows = session.execute(
        text(
            "SELECT h.queue, count(*) AS n FROM held_jobs h JOIN jobs j ON j.id = h.job_id "
            "WHERE j.state = 'waiting' GROUP BY h.queue ORDER BY h.queue"
        )
    ).all()
    return {r.queue: int(r.n) for r in rows}


def held_ids(session: Session, job_ids: list[str]) -> list[str]:
    """Which of ``job_ids`` are held."""
    rows = session.execute(
        text("SELECT job_id FROM held_jobs WHERE job_id = ANY(:ids)"), {"ids": job_ids}
    ).scalars()
    return list(rows)
