"""Request and response models shared by the blueprints and the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
    state: str = Field(
        json_schema_extra={
            "enum": ["waiting", "active", "delayed", "completed", "failed", "waiting-children"]
        }
    )
    progress: Any
    attemptsMade: int
    attemptsStarted: int
    failedReason: str | None
    result: Any
    createdAt: str
    processedOn: str | None
    finishedOn: str | None
    runAt: str | None


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
