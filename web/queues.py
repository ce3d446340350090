"""``/api/v1/queues``: the tenant's jobs per state on every queue it uses, and the pauses
that hold its jobs (operators); pausing and resuming its jobs on a queue.

Every job type's queue is covered — Keel's and those of your own job modules —
from the same trigger-fed counters as the reports queue's health. A tenant's pause holds
its own jobs only; a pause of the whole queue (``keel queues pause``, the system scope)
holds every tenant's and shows here as ``scope: "all"``. How a pause works:
``tasks.jobs.intake.pauses``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from flask import Blueprint, g
from pydantic import BaseModel, ConfigDict, Field

from tasks.jobs.intake import pauses
from tasks.jobs.observe import queue_history
from tasks.jobs.observe.queries import iso
from tasks.jobs.observe.queue_counts import by_queue
from web.api import operation
from web.auth import OPERATOR
from web.errors import ApiError
from web.schemas import Open
from web.system import known_queues

bp = Blueprint("queues", __name__, url_prefix="/api/v1/queues")


class PauseShown(Open):
    queue: str
    scope: str  # "tenant" (this tenant's jobs) or "all" (every tenant's: system scope)
    pausedBy: str | None = None
    pausedAt: datetime  # shown as every timestamp of the API is (``iso``)


class QueueCounts(Open):
    queues: dict[str, dict[str, int]]
    paused: list[PauseShown]


class PauseState(Open):
    queue: str
    paused: bool
    changed: bool  # false: it was so already (pause and resume are idempotent)
    released: int = Field(
        default=0,
        description="resume: the held jobs of this pause published again by this call (up to "
        "5,000; the workers publish the rest)",
    )


class HistoryQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    span: Literal["hour", "day", "week"] = Field(
        default="hour",
        description="hour: 12 buckets of 5 minutes; day: 48 of 30 minutes; week: 28 of 6 hours",
    )


class HistoryBucket(Open):
    start: datetime
    completed: int
    failed: int
    waitAvgS: float | None = Field(description="seconds from due to start, of the timed runs")
    waitMaxS: float | None
    runAvgS: float | None = Field(description="seconds from start to end, of the timed runs")
    runMaxS: float | None


class QueueHistory(Open):
    span: str
    since: datetime
    stepSeconds: int
    queues: dict[str, list[HistoryBucket]] = Field(
        description="each queue the tenant's jobs ended on in the span: its buckets, oldest "
        "first, every one present (the newest still under way)"
    )


def _shown(pause: pauses.Pause) -> dict:
    return {
        "queue": pause.queue,
        "scope": "tenant" if pause.tenant_id else "all",
        # Who paused every tenant's jobs (a system account) is not the tenant's to know.
        "pausedBy": pause.paused_by if pause.tenant_id else None,
        "pausedAt": iso(pause.paused_at),
    }


def _known(queue: str) -> str:
    if queue not in known_queues():
        raise ApiError(404, f"no job type runs on queue {queue!r}", code="queue_not_found")
    return queue


@operation(
    bp,
    "",
    "GET",
    summary="The tenant's jobs per state on each queue it uses, and the pauses holding them",
    role=OPERATOR,
    responses={200: QueueCounts},
)
def queue_counts():
    tenant = g.principal.tenant_id
    return {
        "queues": by_queue(tenant),
        "paused": [_shown(p) for p in pauses.paused(tenant)],
    }


@operation(
    bp,
    "/history",
    "GET",
    summary="Operator: the tenant's jobs ended per queue over the last hour, day or week: "
    "completed, failed, wait and run times per bucket (the dashboard's charts)",
    query=HistoryQuery,
    role=OPERATOR,
    responses={200: QueueHistory, 400: None, 403: None},
)
def history(query: HistoryQuery):
    found = queue_history.history(g.principal.tenant_id, query.span)
    return {
        "span": found.span,
        "since": iso(found.since),
        "stepSeconds": found.step_s,
        "queues": {
            queue: [
                {
                    "start": iso(b.start),
                    "completed": b.completed,
                    "failed": b.failed,
                    "waitAvgS": b.wait_avg_s,
                    "waitMaxS": b.wait_max_s,
                    "runAvgS": b.run_avg_s,
                    "runMaxS": b.run_max_s,
                }
                for b in buckets
            ]
            for queue, buckets in sorted(found.queues.items())
        },
    }


@operation(
    bp,
    "/<queue>/pause",
    "POST",
    summary="Pause the tenant's jobs on a queue: added ones wait, running ones finish",
    role=OPERATOR,
    responses={200: PauseState, 403: None, 404: None},
)
def pause_queue(queue: str):
    principal = g.principal
    changed = pauses.pause(_known(queue), principal.tenant_id, by=principal.user_id)
    return {"queue": queue, "paused": True, "changed": changed, "released": 0}


@operation(
    bp,
    "/<queue>/resume",
    "POST",
    summary="Resume the tenant's jobs on a queue: the jobs its pause held run",
    role=OPERATOR,
    responses={200: PauseState, 403: None, 404: None},
)
def resume_queue(queue: str):
    principal = g.principal
    resumed = pauses.resume(queue, principal.tenant_id, by=principal.user_id)
    if not resumed.lifted:
        # Checked only now: a pause of a queue no job type runs on any more can be lifted.
        _known(queue)
    # Still paused for this tenant if the whole queue is (the system scope's pause).
    still = any(p.queue == queue for p in pauses.paused(principal.tenant_id))
    return {
        "queue": queue,
        "paused": still,
        "changed": resumed.lifted,
        "released": resumed.released,
    }
