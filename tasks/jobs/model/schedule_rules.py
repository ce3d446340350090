"""Job scheduler rules (BullMQ's repeat options) and when they fire: pure logic.

``pattern`` is cron with 5 fields, or 6 with seconds first, read in ``tz``;
``every`` is a period in milliseconds. A new ``every`` rule fires at once; a
``pattern`` rule fires at its next match unless ``immediately`` is set.
Missed fires are not back-filled: after downtime the next fire is the next
one from now, as in BullMQ.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.jobs.model.options import JobOptions


class JobTemplate(BaseModel):
    """The job each fire creates; a scheduler decides the job id itself."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    data: dict[str, Any] = Field(default_factory=dict)
    opts: JobOptions = Field(default_factory=JobOptions)

    @field_validator("opts")
    @classmethod
    def _no_job_id(cls, opts: JobOptions) -> JobOptions:
        if opts.job_id is not None:
            raise ValueError("a scheduler template cannot set jobId: the scheduler derives it")
        if opts.deduplication is not None:
            raise ValueError("a scheduler template cannot set deduplication")
        return opts


class Rule(BaseModel):
    """When a scheduler fires."""

    model_config = ConfigDict(extra="forbid")

    pattern: str | None = Field(default=None, max_length=200)
    tz: str = "UTC"
    every: int | None = Field(default=None, ge=100, description="milliseconds")
    immediately: bool = False
    limit: int | None = Field(default=None, ge=1)
    startDate: AwareDatetime | None = None
    endDate: AwareDatetime | None = None

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, tz: str) -> str:
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {tz!r}") from None
        return tz

    @field_validator("pattern")
    @classmethod
    def _valid_cron(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        fields = pattern.split()
        if len(fields) not in (5, 6):
            raise ValueError("pattern must have 5 fields, or 6 with seconds first")
        if not croniter.is_valid(pattern, second_at_beginning=len(fields) == 6):
            raise ValueError(f"invalid cron pattern {pattern!r}")
        return pattern

    @model_validator(mode="after")
    def _one_rule(self) -> Rule:
        if (self.pattern is None) == (self.every is None):
            raise ValueError("give exactly one of pattern or every")
        if self.startDate and self.endDate and self.endDate <= self.startDate:
            raise ValueError("endDate must be after startDate")
        return self


def _next_match(rule: Rule, after: datetime) -> datetime:
    assert rule.pattern is not None
    six = len(rule.pattern.split()) == 6
    local = after.astimezone(ZoneInfo(rule.tz))
    found: datetime = croniter(rule.pattern, local, second_at_beginning=six).get_next(datetime)
    return found.astimezone(UTC)


def next_fire(rule: Rule, after: datetime, previous: datetime | None) -> datetime | None:
    """The first fire strictly after ``after`` (``previous`` anchors ``every`` rules)."""
    if rule.every is not None:
        period = timedelta(milliseconds=rule.every)
        candidate = (previous or after) + period
        if candidate <= after:  # skip what was missed while nobody fired
            missed = (after - candidate) // period + 1
            candidate += period * missed
    else:
        candidate = _next_match(rule, after)
    if rule.startDate and candidate < rule.startDate:
        return first_fire(rule, rule.startDate - timedelta(microseconds=1), new=False)
    if rule.endDate and candidate > rule.endDate:
        return None
    return candidate


def first_fire(rule: Rule, now: datetime, *, new: bool) -> datetime | None:
    """The first fire of a rule upserted at ``now`` (``new``: no scheduler had this id)."""
    start = max(now, rule.startDate) if rule.startDate else now
    if rule.immediately or (rule.every is not None and new):
        candidate = start
    elif rule.every is not None:
        candidate = start + timedelta(milliseconds=rule.every)
    else:
        candidate = _next_match(rule, start - timedelta(microseconds=1))
    if rule.endDate and candidate > rule.endDate:
        return None
    return candidate
