"""Job scheduler rules (BullMQ's repeat options) and when they fire: pure logic.

``pattern`` is cron with 5 fields, or 6 with seconds first, read in ``tz``;
``every`` is a period in milliseconds. A new ``every`` rule fires at once; a
``pattern`` rule fires at its next match unless ``immediately`` is set.

A scheduler's ``Policy`` says what its fires do about each other (``overlap``), about
slots missed while no beat ran (``catchUp``, ``catchUpWindow``), when a job really starts
(``jitter``) and whether it fires at all (``paused``). The default catch-up is what Keel
always did, as BullMQ does with its one delayed job: after downtime the earliest missed
slot fires once, late, and the next fire is the first slot after now.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
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


Overlap = Literal["allow", "skip", "buffer", "cancel"]
CatchUp = Literal["earliest", "latest", "all"]


class Policy(BaseModel):
    """What a scheduler's fires do (Temporal's schedule policies, in Keel's words).

    ``overlap`` — a slot that comes while the scheduler's last job is live (not finished):
    ``allow`` adds a job anyway; ``skip`` adds none; ``buffer`` holds the slot and fires it
    once the last job ends (one held at most: slots meanwhile are dropped); ``cancel``
    cancels the last job (aborts its run) and adds the new one.
    ``catchUp`` — slots missed while no beat ran: ``earliest`` fires the first of them once
    (what Keel always did), ``latest`` the last of them once, ``all`` each of them; a slot
    older than ``catchUpWindow`` ms is never fired. ``jitter`` — each fired job is delayed
    by a fixed pseudo-random part of it, the same for a slot whichever beat fires it.
    ``paused`` — no fire; resumed, the next slot after now. ``None`` in an upsert: as it was.
    """

    model_config = ConfigDict(extra="forbid")

    overlap: Overlap = "allow"
    catchUp: CatchUp = "earliest"
    catchUpWindow: int | None = Field(
        default=None, ge=1000, description="milliseconds: older missed slots are not fired"
    )
    jitter: int = Field(default=0, ge=0, description="milliseconds: a job starts up to this late")
    paused: bool | None = None

    def stored(self) -> dict[str, Any] | None:
        """What ``job_schedulers.policy`` keeps: the values that are not the defaults."""
        kept = self.model_dump(exclude_defaults=True, exclude_none=True)
        return kept or None

    def view(self) -> dict[str, Any]:
        """Every policy, as a scheduler's description shows it."""
        return {**self.model_dump(exclude_none=True), "paused": bool(self.paused)}


def policy_of(stored: dict[str, Any] | None) -> Policy:
    return Policy.model_validate(stored or {})


def due_slot(rule: Rule, policy: Policy, due: datetime, now: datetime) -> datetime | None:
    """The slot to fire now that ``due`` (the scheduler's next slot) has come; ``None``: every
    missed slot is older than the catch-up window (none is fired)."""
    oldest = now - timedelta(milliseconds=policy.catchUpWindow) if policy.catchUpWindow else None
    if policy.catchUp == "latest":
        slot: datetime | None = last_slot(rule, due, now)
    elif oldest is not None and due < oldest:
        slot = next_fire(rule, oldest - timedelta(microseconds=1), due)
    else:
        slot = due
    if slot is None or slot > now or (oldest is not None and slot < oldest):
        return None
    return slot


def after_fire(rule: Rule, policy: Policy, slot: datetime, now: datetime) -> datetime | None:
    """The next slot after firing ``slot`` at ``now``: for ``catchUp: all`` the one after it
    (still due if it was missed too), else the first after now."""
    if policy.catchUp == "all":
        return next_fire(rule, slot, slot)
    return next_fire(rule, max(slot, now), slot)


def last_slot(rule: Rule, due: datetime, now: datetime) -> datetime:
    """The latest slot at or before ``now`` (and ``endDate``), ``due`` being one not after it."""
    bound = min(now, rule.endDate) if rule.endDate else now
    if bound <= due:
        return due
    if rule.every is not None:
        period = timedelta(milliseconds=rule.every)
        return due + period * ((bound - due) // period)
    assert rule.pattern is not None
    six = len(rule.pattern.split()) == 6
    local = bound.astimezone(ZoneInfo(rule.tz))
    found: datetime = croniter(rule.pattern, local, second_at_beginning=six).get_prev(datetime)
    found = found.astimezone(UTC)
    following = _next_match(rule, found)
    if following <= bound:  # croniter's previous match excludes ``bound`` itself
        found = following
    return max(found, due)


def jitter_ms(policy: Policy, fire_id: str) -> int:
    """This fire's delay within ``jitter``: derived from its id, so every beat agrees."""
    if not policy.jitter:
        return 0
    digest = hashlib.sha256(fire_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % policy.jitter
