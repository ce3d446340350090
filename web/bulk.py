"""``/api/v1/bulk-actions``: an operator acts on every job of its tenant a filter matches.

``POST`` with ``dryRun: true`` answers how many jobs the action would touch (what a client
shows before asking to confirm); without, it records the action, answers 202 with that
count, and the workers do it in batches (``tasks.jobs.upkeep.bulk_actions``); ``GET
/<id>`` follows its progress. Every action matches the operator's own tenant's jobs only;
another tenant's action is 404, as a missing one. ``obliterate`` is the system's scope:
``keel jobs bulk obliterate``.
"""

from __future__ import annotations

from typing import Literal

from flask import Blueprint, g, url_for
from pydantic import AwareDatetime, Field

from tasks.jobs.model.models import State
from tasks.jobs.upkeep import bulk_actions
from tasks.jobs.upkeep.bulk_actions import BulkFilter
from web.api import operation
from web.auth import OPERATOR, Principal
from web.job_query import TEXT
from web.schemas import Open, Strict

bp = Blueprint("bulk", __name__, url_prefix="/api/v1/bulk-actions")

StateName = Literal["waiting", "delayed", "waiting-children", "completed", "failed", "cancelled"]


class BulkFilterBody(Strict):
    """Which jobs (every field given must hold; the tenant is always the operator's)."""

    queue: str | None = Field(default=None, min_length=1, max_length=100, pattern=TEXT)
    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=TEXT)
    states: list[StateName] | None = Field(
        default=None,
        min_length=1,
        max_length=6,
        description="narrows the states the action acts on (default: all of them)",
    )
    createdAfter: AwareDatetime | None = None
    createdBefore: AwareDatetime | None = None
    finishedBefore: AwareDatetime | None = Field(
        default=None, description="clean: only records finished before this moment"
    )


class BulkRequest(Strict):
    action: Literal["retry", "cancel", "promote", "clean", "drain"] = Field(
        description="retry failed jobs, cancel waiting/delayed/waiting-children ones, promote "
        "delayed ones, clean finished records, drain (cancel) a queue's waiting and delayed "
        "jobs"
    )
    filter: BulkFilterBody = Field(default_factory=BulkFilterBody)
    reason: str = Field(min_length=10, max_length=2000, pattern=TEXT)
    dryRun: bool = Field(default=False, description="only count the jobs it would touch")


class BulkPreview(Open):
    action: str
    matched: int


class BulkView(Open):
    id: str
    action: str
    filter: dict
    actor: str
    reason: str
    state: str = Field(json_schema_extra={"enum": ["running", "done"]})
    matched: int = Field(description="the jobs it matched when asked")
    done: int = Field(description="the jobs it has acted on so far")
    createdAt: str
    finishedAt: str | None
    statusUrl: str


def asked_by(principal: Principal, body: BulkRequest) -> bulk_actions.Asked:
    """The action ``body`` asks for, on ``principal``'s tenant's jobs only."""
    chosen = body.filter
    return bulk_actions.Asked(
        action=body.action,
        filter=BulkFilter(
            states=tuple(State(s) for s in dict.fromkeys(chosen.states or ())),
            queue=chosen.queue,
            name=chosen.name,
            tenant_id=principal.tenant_id,  # never another tenant's jobs
            created_after=chosen.createdAfter,
            created_before=chosen.createdBefore,
            finished_before=chosen.finishedBefore,
        ),
        actor=principal.user_id,
        reason=body.reason,
    )


def _shown(row) -> dict:
    view = bulk_actions.describe(row)
    view.pop("tenantId")
    return {**view, "statusUrl": url_for("bulk.get_bulk_action", bulk_id=row.id)}


@operation(
    bp,
    "",
    "POST",
    summary="Act on every job of the tenant a filter matches, in batches (audited once); "
    "dryRun: only count them",
    body=BulkRequest,
    role=OPERATOR,
    responses={200: BulkPreview, 202: BulkView, 400: None, 403: None, 409: None},
    idempotent=True,
)
def start_bulk_action(body: BulkRequest):
    asked = asked_by(g.principal, body)
    if body.dryRun:
        return {"action": body.action, "matched": bulk_actions.preview(asked)}
    return _shown(bulk_actions.start(asked)), 202


@operation(
    bp,
    "/<bulk_id>",
    "GET",
    summary="A bulk action of the tenant: what it matched, how far it got",
    role=OPERATOR,
    responses={200: BulkView, 403: None, 404: None},
)
def get_bulk_action(bulk_id: str):
    return _shown(bulk_actions.view(bulk_id, g.principal.tenant_id))
