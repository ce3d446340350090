"""Request and response models shared by the blueprints and the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tasks.jobs.model.models import STATES


class Strict(BaseModel):
    """Bodies: no unknown fields, no type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Open(BaseModel):
    """Responses: documented fields; more may be added."""

    model_config = ConfigDict(extra="allow")


class Error(Open):
    error: str
    message: str
    details: list[Any]


class JobAccepted(Open):
    jobId: str
    accepted: bool
    statusUrl: str


class JobStatus(Open):
    jobId: str
    name: str
    state: str = Field(json_schema_extra={"enum": [str(state) for state in STATES]})
    progress: Any
    attemptsMade: int
    attemptsStarted: int
    failedReason: str | None
    result: Any
    createdAt: str
    processedOn: str | None
    finishedOn: str | None
    runAt: str | None
    abortRequestedAt: str | None = Field(
        default=None, description="when its run was asked to abort (DELETE of an active job)"
    )


class JobSummary(JobStatus):
    """A job in a listing: its status, queue and user (its data only on its own page)."""

    queue: str
    userId: str | None


class JobView(JobSummary):
    """One job, with what it was added with."""

    data: Any
    opts: Any


class JobList(Open):
    jobs: list[JobSummary]
    nextCursor: str | None = Field(description="pass as ?cursor= for the next page; null: last")


class RetryJob(Strict):
    reason: str = Field(min_length=10, max_length=2000)
    retryCancelled: bool = Field(
        default=False, description="retry a cancelled job too (refused without it: 400)"
    )


class Health(Open):
    status: str


def configured_bound(key: str, read: Callable[[], int]) -> Callable[[dict[str, Any]], None]:
    """``json_schema_extra`` setting ``key`` (``minimum``/``maximum``) of an integer field to a
    configured value, read when the document is built — so it states the limit in force."""

    def apply(schema: dict[str, Any]) -> None:
        for variant in [schema, *schema.get("anyOf", [])]:
            if variant.get("type") == "integer":
                variant[key] = read()

    return apply


class Readiness(Open):
    status: str
    checks: dict[str, str]


class StatusCheck(Open):
    ok: bool
    found: str
    problem: str | None


class SystemStatus(Open):
    healthy: bool
    checks: dict[str, StatusCheck]
