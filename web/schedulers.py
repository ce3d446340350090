"""``/api/v1/schedulers``: job schedulers of the operator's tenant.

A template may name only jobs declared schedulable by tenants, with data their
declaration accepts and no identity of its own: the fired jobs belong to the
scheduler's tenant and the operator who last upserted it. A scheduler's policies
(``overlap``, ``catchUp``, ``catchUpWindow``, ``jitter``, ``paused``) come with its
upsert; ``/pause``, ``/resume`` and ``/trigger`` (run now) act on one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from flask import Blueprint, g, url_for
from pydantic import ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs.model.options import Backoff, JobOptions, KeepJobs
from tasks.jobs.model.schedule_rules import JobTemplate, first_fire, next_fire
from tasks.jobs.schedule import firing, schedulers
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope
from tasks.platform import quotas
from web.api import operation
from web.auth import OPERATOR, Principal
from web.errors import ApiError
from web.schemas import Open, configured_bound

bp = Blueprint("schedulers", __name__, url_prefix="/api/v1/schedulers")
ID = f"^{schedulers.TENANT_ID_RULE}$"  # as documented; checked with fullmatch (see _checked_id)


def _derived_by_the_scheduler(schema: dict) -> None:
    """Document that a template's ``jobId``/``deduplication`` can only be null (see JobTemplate)."""
    for name in ("jobId", "deduplication"):
        schema["properties"][name] = {"type": "null", "description": "set by the scheduler"}


# Bounds on what a tenant's scheduler may ask for. Past them the job layer's date,
# interval and LIMIT arithmetic overflows when the scheduler *fires* — inside beat's
# batch transaction, which then fails on every tick for every tenant.
MAX_PERIOD_MS = 10 * 366 * 86_400_000  # ten years
MAX_KEEP = 1_000_000
Keep = Annotated[int, Field(ge=0, le=MAX_KEEP)]


class TemplateBackoff(Backoff):
    delay: int = Field(default=0, ge=0, le=MAX_PERIOD_MS, description="base delay in milliseconds")


class TemplateKeepJobs(KeepJobs):
    count: int | None = Field(default=None, ge=0, le=MAX_KEEP)
    age: int | None = Field(default=None, ge=0, le=MAX_PERIOD_MS // 1000)


class TemplateOptions(JobOptions):
    """A scheduler template's job options: bounded, and the scheduler derives the job id."""

    model_config = ConfigDict(json_schema_extra=_derived_by_the_scheduler)

    backoff: TemplateBackoff | None = None
    delay: int = Field(
        default=0,
        ge=0,
        le=MAX_PERIOD_MS,
        description="milliseconds, at most the tenant quota maxDelaySeconds",
        json_schema_extra=configured_bound(
            "maximum", lambda: quotas.current().max_delay_seconds * 1000
        ),
    )
    # A Celery task's own (from its max_retries), never a template's.
    max_retries: SkipJsonSchema[None] = Field(default=None, alias="maxRetries")
    # Unset: the default ages (tasks.jobs.upkeep.retention); false keeps every record.
    remove_on_complete: bool | Keep | TemplateKeepJobs | None = Field(
        default=None, alias="removeOnComplete"
    )
    remove_on_fail: bool | Keep | TemplateKeepJobs | None = Field(
        default=None, alias="removeOnFail"
    )


class SchedulerTemplate(JobTemplate):
    opts: TemplateOptions = Field(default_factory=TemplateOptions)


class UpsertScheduler(SchedulerSpec):
    """A scheduler's rule and template (and optionally its queue)."""

    # The document states the exactly-one rule that ``Rule._one_rule`` enforces.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["pattern"], "properties": {"pattern": {"type": "string"}}},
                {"required": ["every"], "properties": {"every": {"type": "integer"}}},
            ]
        }
    )

    every: int | None = Field(default=None, ge=100, le=MAX_PERIOD_MS, description="milliseconds")
    catchUpWindow: int | None = Field(
        default=None,
        ge=1000,
        le=MAX_PERIOD_MS,
        description="milliseconds: missed slots older than this are not fired",
    )
    jitter: int = Field(
        default=0,
        ge=0,
        le=MAX_PERIOD_MS,
        description="milliseconds: each job is delayed by a part of it fixed per slot; with the"
        " template's delay at most the tenant quota maxDelaySeconds",
    )
    paused: bool | None = Field(default=None, description="unset: as it was (new: not paused)")
    template: SchedulerTemplate
    queue: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,99}$")

    @model_validator(mode="after")
    def _fires_within_range(self) -> UpsertScheduler:
        """Refuse a rule whose fire times cannot be computed (a cron that never matches,
        dates at the end of the calendar): upsert and beat would fail on it."""
        if (self.pattern is None) == (self.every is None):
            return self  # Rule._one_rule reports this one
        now = datetime.now(UTC)
        try:
            first = first_fire(self, now, new=False)
            if first is not None:
                next_fire(self, first, first)
        except (OverflowError, ValueError) as exc:  # CroniterBadDateError is a ValueError
            raise ValueError(f"the rule has no computable fire time: {exc}") from None
        return self


class SchedulerView(Open):
    id: str
    queue: str
    iterationCount: int
    next: str | None = Field(description="null: paused, finished or parked")
    overlap: Literal["allow", "skip", "buffer", "cancel"]
    catchUp: Literal["earliest", "latest", "all"]
    catchUpWindow: int | None = None
    jitter: int
    paused: bool


class Triggered(Open):
    """What a run-now did: ``added`` a job; ``skipped`` (its last job is live, ``overlap``
    ``skip`` or ``buffer`` with one held already); ``buffered`` (held until it ends)."""

    outcome: Literal["added", "skipped", "buffered"]
    jobId: str | None
    statusUrl: str | None


class SchedulerList(Open):
    schedulers: list[SchedulerView]


def scope_of(principal: Principal) -> Scope:
    """An operator's schedulers: its tenant's (the API's and the dashboard's rule)."""
    return Scope(tenant_id=principal.tenant_id, actor=principal.user_id)


def _scope() -> Scope:
    return scope_of(g.principal)


def upsert_for(principal: Principal, scheduler_id: str, body: UpsertScheduler) -> dict:
    """Create or update a scheduler of the operator's tenant; its description."""
    load_job_modules()  # every job type declared, whichever this process imported so far
    spec = SchedulerSpec.model_validate(body.model_dump(exclude={"queue"}))
    record = schedulers.upsert(
        scope_of(principal),
        _checked_id(scheduler_id),
        spec,
        queue=body.queue,
        quota=quotas.current().scheduling,
    )
    return schedulers.describe(record)


def _checked_id(scheduler_id: str) -> str:
    """The dashboard's form reaches here without the path's check: ``fullmatch``, as ``re.match``
    with ``$`` takes "nightly\\n" (a scheduler no path could name again)."""
    if not re.fullmatch(ID, scheduler_id):
        raise ApiError(400, "invalid scheduler id", code="validation_failed")
    return scheduler_id


@operation(
    bp,
    "/<scheduler_id>",
    "PUT",
    summary="Create or update a job scheduler",
    body=UpsertScheduler,
    role=OPERATOR,
    responses={200: SchedulerView},
    params={"scheduler_id": ID},
)
def upsert_scheduler(scheduler_id: str, body: UpsertScheduler):
    return upsert_for(g.principal, scheduler_id, body)


@operation(
    bp,
    "",
    "GET",
    summary="The tenant's job schedulers",
    role=OPERATOR,
    responses={200: SchedulerList},
)
def list_schedulers():
    return {"schedulers": [schedulers.describe(r) for r in schedulers.list_all(_scope())]}


@operation(
    bp,
    "/<scheduler_id>",
    "GET",
    summary="One job scheduler",
    role=OPERATOR,
    responses={200: SchedulerView, 404: None},
)
def get_scheduler(scheduler_id: str):
    return schedulers.describe(schedulers.get(_scope(), scheduler_id))


@operation(
    bp,
    "/<scheduler_id>",
    "DELETE",
    summary="Remove a job scheduler",
    role=OPERATOR,
    responses={204: None, 404: None},
)
def remove_scheduler(scheduler_id: str):
    schedulers.remove(_scope(), scheduler_id)
    return "", 204


def pause_for(principal: Principal, scheduler_id: str, paused: bool) -> dict:
    """Pause or resume a scheduler of the operator's tenant; its description."""
    return schedulers.describe(schedulers.set_paused(scope_of(principal), scheduler_id, paused))


def trigger_for(principal: Principal, scheduler_id: str) -> dict:
    """Fire a scheduler of the operator's tenant now, under its overlap policy."""
    load_job_modules()
    fired = firing.trigger(scope_of(principal), scheduler_id, quotas.current().jobs)
    job_id = fired.job_id if fired.outcome == "added" else None
    status = url_for("jobs.get_job", job_id=job_id) if job_id else None
    return {"outcome": fired.outcome, "jobId": job_id, "statusUrl": status}


@operation(
    bp,
    "/<scheduler_id>/pause",
    "POST",
    summary="Pause a job scheduler: no fire until it is resumed",
    role=OPERATOR,
    responses={200: SchedulerView, 404: None},
)
def pause_scheduler(scheduler_id: str):
    return pause_for(g.principal, scheduler_id, True)


@operation(
    bp,
    "/<scheduler_id>/resume",
    "POST",
    summary="Resume a paused job scheduler: it fires at its next slot after now",
    role=OPERATOR,
    responses={200: SchedulerView, 404: None},
)
def resume_scheduler(scheduler_id: str):
    return pause_for(g.principal, scheduler_id, False)


@operation(
    bp,
    "/<scheduler_id>/trigger",
    "POST",
    summary="Run a job scheduler now (paused or not), under its overlap policy; its next slot"
    " is unchanged",
    role=OPERATOR,
    responses={200: Triggered, 404: None, 429: None},
    idempotent=True,
)
def trigger_scheduler(scheduler_id: str):
    return trigger_for(g.principal, scheduler_id)
