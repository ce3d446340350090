"""``/api/v1/system/queues/.../limits``: queue limits changed live, in the system scope.

A queue's limits are shared by every tenant on it, so they are the system's to change: these
endpoints take the ``KEEL_METRICS_TOKEN`` as bearer token (as ``GET /api/v1/system/status``)
and refuse any tenant's token, an operator's too (403). ``keel queues limits`` does the same
from the command line. How a change reaches the workers: ``tasks.jobs.run.live_limits``.
"""

from __future__ import annotations

from flask import Blueprint
from pydantic import BaseModel, ConfigDict, Field

from tasks.jobs.run import live_limits
from tasks.platform.ids import CONTROL
from tasks.platform.setting_types import Rate
from web.api import operation
from web.errors import ApiError
from web.schemas import Open, Strict
from web.system import metrics_token

bp = Blueprint("queue_limits", __name__, url_prefix="/api/v1/system/queues")

# Who changed a limit, in the audit: the metrics token names no person (the reason can).
API_ACTOR = "api:metrics-token"
TEXT = rf"^[^{CONTROL}]+$"
QUEUE = {"queue": rf"^[^{CONTROL}/]{{1,100}}$"}
SYSTEM_ONLY = "With the `KEEL_METRICS_TOKEN` as bearer token only (a tenant's token is 403)"


class RateShape(Strict):
    max: int = Field(ge=1, le=1_000_000, description="starts at most per window")
    durationMs: int = Field(ge=1, le=86_400_000, description="the window, in milliseconds")


class SetQueueLimits(Strict):
    """The fields given replace the queue's ``KEEL_QUEUE_LIMITS`` default; ``null``: no limit;
    a field left out keeps its default."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["concurrency"]}, {"required": ["rate"]}]}
    )

    concurrency: int | None = Field(
        default=None, ge=1, le=100_000, description="jobs of the queue running at once"
    )
    rate: RateShape | None = None
    reason: str = Field(min_length=10, max_length=2000, pattern=TEXT, description="audited")


class ClearQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=10, max_length=2000, pattern=TEXT, description="audited")


class LimitShown(Open):
    concurrency: int | None = None
    rate: RateShape | None = None


class OverrideShown(Open):
    concurrency: int | None = None
    rate: RateShape | None = None
    setBy: str
    setAt: str
    reason: str


class QueueLimitsShown(Open):
    queue: str
    effective: LimitShown | None = Field(description="in force on every worker; null: none")
    default: LimitShown | None = Field(description="from KEEL_QUEUE_LIMITS")
    override: OverrideShown | None = Field(description="set live; null: the default is in force")
    source: str = Field(description='"live", "KEEL_QUEUE_LIMITS" or "none"')


class QueueLimitsList(Open):
    queues: list[QueueLimitsShown]
    refreshSeconds: float = Field(description="each worker process reads changes this often")


class LimitChangeShown(Open):
    id: int
    actor: str
    reason: str
    before: LimitShown | None
    after: LimitShown | None
    recordedAt: str


class QueueLimitsDetail(QueueLimitsShown):
    changes: list[LimitChangeShown] = Field(description="the newest 50 changes, newest first")


class QueueLimitsChanged(QueueLimitsShown):
    changed: bool = Field(description="false: there was no override to clear")


@operation(
    bp,
    "/limits",
    "GET",
    summary="Every queue's limits: in force, the `KEEL_QUEUE_LIMITS` default and what was set "
    f"live (by whom, when, why). {SYSTEM_ONLY}",
    responses={200: QueueLimitsList},
    admits=metrics_token,
    tenants=False,
)
def list_queue_limits():
    shown = [live_limits.to_json(limits) for limits in live_limits.shown()]
    return {"queues": shown, "refreshSeconds": live_limits.REFRESH_S}


@operation(
    bp,
    "/<queue>/limits",
    "GET",
    summary=f"One queue's limits and the newest 50 changes of them. {SYSTEM_ONLY}",
    responses={200: QueueLimitsDetail, 400: None},
    params=QUEUE,
    admits=metrics_token,
    tenants=False,
)
def get_queue_limits(queue: str):
    changes = [live_limits.change_json(change) for change in live_limits.history(queue)]
    return {**live_limits.to_json(live_limits.of(queue)), "changes": changes}


@operation(
    bp,
    "/<queue>/limits",
    "PUT",
    summary="Set a queue's limits live (concurrency, rate): in force on every worker within "
    "about a second, no restart; running jobs are not stopped (a lower concurrency refuses new "
    f"starts until fewer run). Audited. {SYSTEM_ONLY}",
    responses={200: QueueLimitsShown, 400: None},
    body=SetQueueLimits,
    params=QUEUE,
    admits=metrics_token,
    tenants=False,
)
def put_queue_limits(queue: str, body: SetQueueLimits):
    put_limits(queue, body, API_ACTOR)
    return live_limits.to_json(live_limits.of(queue))


def put_limits(queue: str, body: SetQueueLimits, actor: str) -> None:
    """Set ``queue``'s limits as ``body`` says, audited as ``actor``'s change (the API's, the
    dashboard's platform role's); no limit given: a 400 naming both fields."""
    given = body.model_fields_set - {"reason"}
    if not given:
        raise ApiError(
            400,
            "give concurrency or rate (null: no limit)",
            code="validation_failed",
            details=[
                {"field": name, "type": "missing", "message": "give concurrency or rate"}
                for name in ("concurrency", "rate")
            ],
        )
    rate = Rate(max=body.rate.max, duration_ms=body.rate.durationMs) if body.rate else None
    override = live_limits.stored(body.concurrency, rate, given)
    live_limits.set_limits(queue, override, actor, body.reason)


@operation(
    bp,
    "/<queue>/limits",
    "DELETE",
    summary="Clear the limits set live on a queue: its `KEEL_QUEUE_LIMITS` default is in force "
    f"again within about a second. Audited. {SYSTEM_ONLY}",
    responses={200: QueueLimitsChanged, 400: None},
    query=ClearQuery,
    params=QUEUE,
    admits=metrics_token,
    tenants=False,
)
def delete_queue_limits(queue: str, query: ClearQuery):
    change = live_limits.clear_limits(queue, API_ACTOR, query.reason)
    return {**live_limits.to_json(live_limits.of(queue)), "changed": change is not None}
