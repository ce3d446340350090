"""The query of a job listing (``GET /api/v1/jobs``, the dashboard's jobs page): filters,
search and paging, and which jobs a principal may list with it.

A search narrows the list by the job's data (``tasks.jobs.model.search``: ``data`` as
terms or a JSON object, or ``data.<path>=<value>`` parameters), id prefix, added and
ended times, and failed-reason text; every filter holds (AND), within the principal's
own jobs (a user) or tenant (an operator), newest first, paged as any listing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Annotated, Any, Literal, get_args

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from tasks.jobs.model import search
from tasks.jobs.model.models import STATES
from tasks.jobs.model.search import DataMatch, SearchRefused
from tasks.jobs.observe.queries import DEFAULT_PAGE, MAX_PAGE, JobFilter
from tasks.platform.ids import CONTROL
from web.auth import Principal
from web.errors import ApiError

# Printable text: no control character nor line break (``tasks.platform.ids``; Postgres text cannot
# hold NUL). A pydantic pattern: its engine (Rust's regex) anchors ``$`` at the very end.
TEXT = rf"^[^{CONTROL}]+$"
StateName = Literal[
    "waiting", "active", "delayed", "completed", "failed", "waiting-children", "cancelled"
]
assert set(get_args(StateName)) == set(STATES)


# RFC 3339, as the document's ``date-time`` says: pydantic's lax mode would also read a
# number of seconds since 1970 ("0.5") as a time.
RFC_3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _rfc_3339(value: Any) -> Any:
    if isinstance(value, str) and not RFC_3339.fullmatch(value):
        raise ValueError("a time as RFC 3339 with its offset: 2026-12-07T10:00:00Z")
    return value


Moment = Annotated[AwareDatetime, BeforeValidator(_rfc_3339)]


class JobListQuery(BaseModel):
    """Filters, search and paging of ``GET /api/v1/jobs`` (query values are read laxly:
    ``limit=20``). ``data.<path>=<value>`` parameters, any number of paths, are collected
    into ``dataTerms`` (left out of the OpenAPI document: their names are the user's)."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(default=None, min_length=1, max_length=100, pattern=TEXT)
    state: StateName | None = None
    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=TEXT)
    data: str | None = Field(
        default=None,
        min_length=1,
        max_length=search.MAX_TEXT,
        pattern=TEXT,
        description="jobs whose data contain this: path=value terms separated by spaces "
        '(customerId=42 customer.region=eu-west-1; 42 matches 42 and "42") or a JSON object '
        '({"tags": ["vip"]}). Also as data.<path>=<value> parameters: data.customerId=42',
    )
    dataTerms: SkipJsonSchema[dict[str, str]] = Field(default_factory=dict, exclude=True)
    idPrefix: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=TEXT,
        description="jobs whose id starts with this",
    )
    createdFrom: Moment | None = Field(default=None, description="added at or after")
    createdTo: Moment | None = Field(default=None, description="added at or before")
    finishedFrom: Moment | None = Field(default=None, description="ended at or after")
    finishedTo: Moment | None = Field(default=None, description="ended at or before")
    error: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=TEXT,
        description="jobs whose failed reason contains this text, in any case",
    )
    cursor: str | None = Field(
        default=None,
        min_length=1,
        max_length=400,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the nextCursor of the previous page",
    )
    limit: int = Field(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE)

    @model_validator(mode="before")
    @classmethod
    def _data_terms(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        terms = {k[len(DATA_TERM) :]: v for k, v in given.items() if k.startswith(DATA_TERM)}
        if not terms:
            return given
        rest = {k: v for k, v in given.items() if not k.startswith(DATA_TERM)}
        return {**rest, "dataTerms": terms}

    @property
    def searching(self) -> bool:
        return any(getattr(self, name) is not None for name in SEARCH_FIELDS) or bool(
            self.dataTerms
        )

    def data_matches(self) -> tuple[DataMatch, ...]:
        """The data conditions of ``data`` and every ``data.<path>`` (400 naming the one
        that cannot be read)."""
        found: list[DataMatch] = []
        for field, read in self._data_readers():
            try:
                found.extend(read())
            except SearchRefused as exc:
                raise _refused(field, str(exc)) from None
        try:
            return search.checked(found)
        except SearchRefused as exc:
            raise _refused("data", str(exc)) from None

    def _data_readers(self) -> list[tuple[str, Callable[[], Sequence[DataMatch]]]]:
        readers: list[tuple[str, Callable[[], Sequence[DataMatch]]]] = []
        if self.data is not None:
            readers.append(("data", partial(search.parse, self.data)))
        for path, raw in self.dataTerms.items():
            readers.append((DATA_TERM + path, partial(_one_term, path, raw)))
        return readers


DATA_TERM = "data."
SEARCH_FIELDS = (
    "data",
    "idPrefix",
    "createdFrom",
    "createdTo",
    "finishedFrom",
    "finishedTo",
    "error",
)


def _one_term(path: str, raw: str) -> tuple[DataMatch]:
    return (search.term(path, raw),)


def _refused(field: str, message: str) -> ApiError:
    return ApiError(
        400,
        "the query string is invalid",
        code="validation_failed",
        details=[{"field": field, "type": "search", "message": message}],
    )


# Who sees and acts on which job, for the API and the dashboard (``web.ui``) alike: a user
# its own jobs, an operator every job of its tenant; anything else is a missing job (404).
# The dashboard's platform sessions (``web.ui.platform``; never a token) read every tenant's.


def visible_to(principal: Principal, query: JobListQuery, tenant: str | None = None) -> JobFilter:
    """The jobs ``principal`` may list, narrowed by the query's filters. ``tenant`` narrows a
    platform session's every-tenant scope to one tenant; a tenant's principal has its own
    tenant's scope, whatever ``tenant`` says."""
    if principal.platform:
        return _narrowed(query, tenant_id=tenant, user_id=None)  # None: every tenant's
    user = None if principal.operator else principal.user_id
    return _narrowed(query, tenant_id=principal.tenant_id, user_id=user)


def _narrowed(query: JobListQuery, tenant_id: str | None, user_id: str | None) -> JobFilter:
    return JobFilter(
        tenant_id=tenant_id,
        user_id=user_id,
        queue=query.queue,
        state=query.state,
        name=query.name,
        id_prefix=query.idPrefix,
        data=query.data_matches(),
        created_from=query.createdFrom,
        created_to=query.createdTo,
        finished_from=query.finishedFrom,
        finished_to=query.finishedTo,
        error=query.error,
    )
