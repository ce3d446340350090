"""``/api/v1/system/key-limits``: a job type's key limits overridden live, in the system scope.

A job type's key limits (``max_running``, rate) hold across every tenant's jobs, so their
overrides are the system's to set, even one tenant's: these endpoints take the
``KEEL_METRICS_TOKEN`` as bearer token (as the queue limits, ``web.queue_limits``) and
refuse any tenant's token, an operator's too (403). ``keel limits keys`` does the same from
the command line. Which override a key takes: ``tasks.jobs.model.key_overrides``; how a
change reaches the workers: ``tasks.jobs.run.live_key_limits``.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from pydantic import BaseModel, ConfigDict, Field

from tasks.jobs.run import live_key_limits
from tasks.jobs.run.live_key_limits import OverrideRefused, UnknownJobType
from tasks.platform.ids import CONTROL
from web.api import operation
from web.errors import ApiError
from web.queue_limits import API_ACTOR, SYSTEM_ONLY, TEXT, RateShape
from web.schemas import Open, Strict
from web.system import metrics_token

bp = Blueprint("key_limits", __name__, url_prefix="/api/v1/system/key-limits")

JOB_NAME = {"job_name": rf"^[^{CONTROL}/]{{1,200}}$"}
TENANT = rf"^[^{CONTROL}]+$"
KEY = rf"^[^{CONTROL}]+$"
# The API's field names of an override's fields (``key_overrides.FIELDS``).
FIELD_NAMES = {"max_running": "maxRunning", "rate": "rate", "rate.max": "rate.max"}
FIELD_NAMES["rate.per_ms"] = "rate.durationMs"
FIELD_NAMES["limits"] = "maxRunning"

TenantField = Field(
    default="*", min_length=1, max_length=200, pattern=TENANT, description='a tenant id; "*": any'
)
KeyField = Field(
    min_length=1,
    max_length=100,
    pattern=KEY,
    description='a key ("partner-7") or a pattern where * is any run of characters ("partner-*")',
)
ReasonField = Field(min_length=10, max_length=2000, pattern=TEXT, description="audited")


class SetKeyLimit(Strict):
    """The fields given replace the job type's declared ``max_running`` / rate for the keys
    matched; ``null``: no such limit; a field left out is decided by a less specific override
    or the declaration."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["maxRunning"]}, {"required": ["rate"]}]}
    )

    tenant: str = TenantField
    key: str = KeyField
    maxRunning: int | None = Field(
        default=None, ge=1, le=10_000, description="jobs of one key running at once"
    )
    rate: RateShape | None = None
    reason: str = ReasonField


class ClearQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = TenantField
    key: str = KeyField
    reason: str = ReasonField


class InForceQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=TENANT,
        description="with key",
    )
    key: str | None = Field(
        default=None, min_length=1, max_length=100, pattern=KEY, description="a job's key"
    )


class KeyLimitsDeclared(Open):
    key: str | None = Field(description="the key_concurrency's key (a data field)")
    maxRunning: int | None
    strategy: str | None
    rateKey: str | None = Field(description="the key_rate's key")
    rate: RateShape | None


class KeyLimitOverrideShown(Open):
    tenant: str
    key: str
    maxRunning: int | None = None
    rate: RateShape | None = None
    setBy: str
    setAt: str
    reason: str


class JobKeyLimitsShown(Open):
    name: str
    declared: KeyLimitsDeclared | None = Field(description="null: none (an override is left)")
    overrides: list[KeyLimitOverrideShown] = Field(description="most specific first")


class KeyLimitsList(Open):
    jobs: list[JobKeyLimitsShown]
    refreshSeconds: float = Field(description="each worker process reads changes this often")


class KeyLimitFields(Open):
    maxRunning: int | None = None
    rate: RateShape | None = None


class KeyLimitChangeShown(Open):
    id: int
    name: str
    tenant: str
    key: str
    actor: str
    reason: str
    before: KeyLimitFields | None
    after: KeyLimitFields | None
    recordedAt: str


class KeyLimitsInForce(Open):
    tenant: str | None
    key: str
    maxRunning: int | None
    rate: RateShape | None
    maxRunningFrom: Any = Field(description='"declared", {tenant, key} of an override, or null')
    rateFrom: Any = Field(description='"declared", {tenant, key} of an override, or null')


class JobKeyLimitsDetail(JobKeyLimitsShown):
    changes: list[KeyLimitChangeShown] = Field(description="the newest 50 changes, newest first")
    inForce: KeyLimitsInForce | None = Field(
        default=None, description="what holds for the key (and tenant) asked, if asked"
    )


class JobKeyLimitsChanged(JobKeyLimitsShown):
    changed: bool = Field(description="false: there was no such override to clear")


def _known(job_name: str) -> live_key_limits.JobKeyLimits:
    try:
        return live_key_limits.of(job_name)
    except UnknownJobType as exc:
        raise ApiError(404, str(exc), code="job_type_not_found") from None


@operation(
    bp,
    "",
    "GET",
    summary="Every job type's key limits: declared (key_concurrency, key_rate) and the "
    f"overrides set live (by whom, when, why), most specific first. {SYSTEM_ONLY}",
    responses={200: KeyLimitsList},
    admits=metrics_token,
    tenants=False,
)
def list_key_limits():
    shown = [live_key_limits.to_json(limits) for limits in live_key_limits.shown()]
    return {"jobs": shown, "refreshSeconds": live_key_limits.REFRESH_S}


@operation(
    bp,
    "/<job_name>",
    "GET",
    summary="One job type's key limits, its overrides and their newest 50 changes; with "
    f"`key` (and `tenant`), what holds for that key and which override decides. {SYSTEM_ONLY}",
    responses={200: JobKeyLimitsDetail, 400: None, 404: None},
    query=InForceQuery,
    params=JOB_NAME,
    admits=metrics_token,
    tenants=False,
)
def get_key_limits(job_name: str, query: InForceQuery):
    limits = _known(job_name)
    changes = [live_key_limits.change_json(c) for c in live_key_limits.history(job_name)]
    shown: dict[str, Any] = {**live_key_limits.to_json(limits), "changes": changes}
    if query.key is not None:  # a tenant without a key asks nothing
        shown["inForce"] = live_key_limits.in_force(limits, query.tenant, query.key)
    return shown


def _refused(field: str, message: str) -> ApiError:
    return ApiError(
        400,
        f"{field}: {message}",
        code="validation_failed",
        details=[{"field": field, "type": "value_error", "message": message}],
    )


@operation(
    bp,
    "/<job_name>",
    "PUT",
    summary="Override a job type's key limits (maxRunning, rate) live for one tenant's keys or "
    'any tenant\'s ("*"), one key or a pattern ("partner-*"): in force on every worker within '
    "about a second, no restart; running jobs are not stopped. The most specific override of "
    f"a key wins, field by field. Audited. {SYSTEM_ONLY}",
    responses={200: JobKeyLimitsShown, 400: None, 404: None},
    body=SetKeyLimit,
    params=JOB_NAME,
    admits=metrics_token,
    tenants=False,
)
def put_key_limits(job_name: str, body: SetKeyLimit):
    try:
        put_override(job_name, body, API_ACTOR)
    except UnknownJobType as exc:
        raise ApiError(404, str(exc), code="job_type_not_found") from None
    return live_key_limits.to_json(live_key_limits.of(job_name))


def put_override(job_name: str, body: SetKeyLimit, actor: str) -> None:
    """Set the override of ``job_name``'s key limits ``body`` says, audited as ``actor``'s
    change (the API's, the dashboard's platform role's). A field refused: a 400 naming it;
    ``UnknownJobType`` for its caller to answer (the API: 404 on its path; a form: 400 on
    its field)."""
    problem = live_key_limits.pattern_problem(body.key)
    if problem:
        raise _refused("key", problem)
    given: dict[str, Any] = {}
    if "maxRunning" in body.model_fields_set:
        given["max_running"] = body.maxRunning
    if "rate" in body.model_fields_set:
        rate = body.rate
        given["rate"] = None if rate is None else {"max": rate.max, "per_ms": rate.durationMs}
    if not given:
        raise _refused("maxRunning", "give maxRunning or rate (null: no such limit)")
    try:
        live_key_limits.set_override(job_name, body.tenant, body.key, given, actor, body.reason)
    except OverrideRefused as exc:
        raise _refused(FIELD_NAMES.get(exc.field, exc.field), exc.message) from None


@operation(
    bp,
    "/<job_name>",
    "DELETE",
    summary="Clear one override of a job type's key limits (its tenant and key as set): the "
    "declaration, or a less specific override, holds again within about a second. Audited. "
    f"{SYSTEM_ONLY}",
    responses={200: JobKeyLimitsChanged, 400: None, 404: None},
    query=ClearQuery,
    params=JOB_NAME,
    admits=metrics_token,
    tenants=False,
)
def delete_key_limits(job_name: str, query: ClearQuery):
    change = live_key_limits.clear_override(
        job_name, query.tenant, query.key, API_ACTOR, query.reason
    )
    found = live_key_limits.shown(job_name)
    if not found and change is None:
        raise ApiError(404, str(UnknownJobType(job_name)), code="job_type_not_found")
    # Its last override cleared, a job type that no longer declares key limits shows none.
    shown = live_key_limits.to_json(found[0]) if found else {"name": job_name, "declared": None}
    return {"overrides": [], **shown, "changed": change is not None}
