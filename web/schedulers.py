"""``/api/v1/schedulers``: job schedulers of the operator's tenant."""

from __future__ import annotations

import re

from flask import Blueprint, g
from pydantic import Field

from tasks.jobs import schedulers
from tasks.jobs.schedulers import SchedulerSpec, Scope
from web.api import operation
from web.errors import ApiError
from web.schemas import Open

bp = Blueprint("schedulers", __name__, url_prefix="/api/v1/schedulers")
OPERATOR = "operator"
ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"


class UpsertScheduler(SchedulerSpec):
    """A scheduler's rule and template (and optionally its queue)."""

    queue: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,99}$")


class SchedulerView(Open):
    id: str
    queue: str
    iterationCount: int
    next: str | None


class SchedulerList(Open):
    schedulers: list[SchedulerView]


def _scope() -> Scope:
    return Scope(tenant_id=g.principal.tenant_id, actor=g.principal.user_id)


def _checked_id(scheduler_id: str) -> str:
    if not re.match(ID, scheduler_id):
        raise ApiError(400, "invalid scheduler id", code="validation_failed")
    return scheduler_id


@operation(bp, "/<scheduler_id>", "PUT", summary="Create or update a job scheduler",
           body=UpsertScheduler, role=OPERATOR, responses={200: SchedulerView})  # fmt: skip
def upsert_scheduler(scheduler_id: str, body: UpsertScheduler):
    spec = SchedulerSpec.model_validate(body.model_dump(exclude={"queue"}))
    record = schedulers.upsert(_scope(), _checked_id(scheduler_id), spec, queue=body.queue)
    return schedulers.describe(record)


@operation(bp, "", "GET", summary="The tenant's job schedulers", role=OPERATOR,
           responses={200: SchedulerList})  # fmt: skip
def list_schedulers():
    return {"schedulers": [schedulers.describe(r) for r in schedulers.list_all(_scope())]}


@operation(bp, "/<scheduler_id>", "GET", summary="One job scheduler", role=OPERATOR,
           responses={200: SchedulerView, 404: None})  # fmt: skip
def get_scheduler(scheduler_id: str):
    return schedulers.describe(schedulers.get(_scope(), scheduler_id))


@operation(bp, "/<scheduler_id>", "DELETE", summary="Remove a job scheduler", role=OPERATOR,
           responses={204: None, 404: None})  # fmt: skip
def remove_scheduler(scheduler_id: str):
    schedulers.remove(_scope(), scheduler_id)
    return "", 204
