"""Statements on a chord body's record: its parts' results, its release or failure.

A chord of Keel tasks keeps its fan-in on the body's record (``waiting-children``
until its parts end): the ids of its parts (``chordParts``) and, as each part
ends, its result (``chordResults``). Each statement locks the body's row first,
so parts that end at the same moment take turns, and exactly one of them sees
the last result arrive.

A part whose add created no record of its own — its dedup id named a live job,
or its id named a job that exists already — stands for that job
(``chordBound``: part id → job id); its result is that job's once it ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.model.models import JobRecord
from tasks.jobs.store.jobs import ReadyJob, get, ready_job


def chord_body_id(ctx: dict[str, Any] | None) -> str | None:
    """The id of the chord body a job's Celery context says it is a part of."""
    body = (ctx or {}).get("chord")
    if not isinstance(body, dict):
        return None
    task_id = (body.get("options") or {}).get("task_id")
    return str(task_id) if task_id else None


_RECORD_PART = text(
    """
    WITH body AS (SELECT id FROM jobs WHERE id = :body AND state = 'waiting-children'
                  AND celery_ctx ? 'chordParts' FOR UPDATE)
    UPDATE jobs SET celery_ctx = jsonb_set(jobs.celery_ctx, '{chordResults}',
        COALESCE(jobs.celery_ctx -> 'chordResults', '{}'::jsonb)
        || jsonb_build_object(CAST(:part AS text), CAST(:result AS jsonb)))
    FROM body WHERE jobs.id = body.id
    RETURNING jobs.celery_ctx
    """
)


def record_part(session: Session, body_id: str, part_id: str, result: Any) -> dict[str, Any] | None:
    """Keep a part's result on its chord's body; the body's context, or ``None`` if the body
    is not a waiting Keel chord body (released already, failed, or not Keel's)."""
    row = session.execute(
        _RECORD_PART, {"body": body_id, "part": part_id, "result": json.dumps(result)}
    ).first()
    return dict(row[0]) if row is not None else None


def is_keel_chord(session: Session, body_id: str) -> bool:
    """Whether ``body_id`` is the body of a chord counted in the records."""
    statement = text("SELECT celery_ctx ? 'chordParts' FROM jobs WHERE id = :id")
    return bool(session.execute(statement, {"id": body_id}).scalar())


def release_body(
    session: Session, body_id: str, data: dict[str, Any], ctx: dict[str, Any]
) -> ReadyJob | None:
    """Every part ended: the body becomes waiting with its arguments (the caller publishes)."""
    row = session.execute(
        text(
            """
            UPDATE jobs SET state = 'waiting', data = CAST(:data AS jsonb),
                celery_ctx = CAST(:ctx AS jsonb)
            WHERE id = :id AND state = 'waiting-children'
            RETURNING id, name, queue, data, celery_ctx, tenant_id, priority
            """
        ),
        {"id": body_id, "data": json.dumps(data), "ctx": json.dumps(ctx)},
    ).first()
    return ready_job(row) if row is not None else None


def fail_body(session: Session, body_id: str, reason: str) -> JobRecord | None:
    """A part failed for good: the body fails without running (Celery's ``ChordError``);
    its record, for what its end triggers (``tasks.jobs.end.ending``)."""
    row = session.execute(
        text(
            """
            UPDATE jobs SET state = 'failed', failed_reason = :reason,
                finished_on = clock_timestamp()
            WHERE id = :id AND state = 'waiting-children'
            RETURNING id
            """
        ),
        {"id": body_id, "reason": reason},
    ).first()
    return get(session, body_id) if row is not None else None


_BIND_PART = text(
    """
    UPDATE jobs SET celery_ctx = jsonb_set(celery_ctx, '{chordBound}',
        COALESCE(celery_ctx -> 'chordBound', '{}'::jsonb)
        || jsonb_build_object(CAST(:part AS text), CAST(:job AS text)))
    WHERE id = :body AND state = 'waiting-children' AND celery_ctx ? 'chordParts'
    """
)


def bind_part(session: Session, body_id: str, part_id: str, job_id: str) -> None:
    """A part of a Keel chord stands for the existing job ``job_id`` (nothing for another
    chord: Celery counts those)."""
    session.execute(_BIND_PART, {"body": body_id, "part": part_id, "job": job_id})


@dataclass(frozen=True)
class BoundPart:
    """A bound part whose job has ended, or is gone (``state`` ``None``)."""

    body_id: str
    part_id: str
    job_id: str
    state: str | None
    result: Any
    failed_reason: str | None


# The job must be the body's owner's: a tenant's chord never reads another's result.
_ENDED_BOUND_PARTS = text(
    """
    SELECT body.id, part.key, part.value, job.state, job.result, job.failed_reason
    FROM jobs AS body
    CROSS JOIN LATERAL jsonb_each_text(body.celery_ctx -> 'chordBound') AS part(key, value)
    LEFT JOIN jobs AS job
        ON job.id = part.value AND job.tenant_id IS NOT DISTINCT FROM body.tenant_id
    WHERE body.state = 'waiting-children' AND body.celery_ctx ? 'chordBound'
        AND NOT COALESCE(body.celery_ctx -> 'chordResults' ? part.key, false)
        AND (job.id IS NULL OR job.state IN ('completed', 'failed', 'cancelled'))
    ORDER BY body.id
    LIMIT :limit
    """
)


def ended_bound_parts(session: Session, limit: int) -> list[BoundPart]:
    """Bound parts not counted yet whose job has ended (or has no record the body may read)."""
    rows = session.execute(_ENDED_BOUND_PARTS, {"limit": limit}).all()
    return [BoundPart(*row) for row in rows]
