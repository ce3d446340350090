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

from flask import Blueprint, g
from pydantic import Field

from tasks.jobs.intake import pauses
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
