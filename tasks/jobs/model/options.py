"""Job options (BullMQ's names) and the backoff rule they imply."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tasks.platform.config import get_settings

MAX_TIMEOUT_MS = 86_400_000  # a day
# ``model_validate(..., context=STORED)``: options read back from a record, not asked for now.
STORED = {"stored": True}


def timeout_cap_ms() -> int:
    """The longest ``timeout`` a job may ask for: ``KEEL_MAX_JOB_TIMEOUT_S``, in milliseconds.

    A run longer than a worker's shutdown grace is killed by a rollout and runs again as
    stalled, so a deployment sets this to what its workers' grace covers
    (docs/operations/kubernetes.md).
    """
    return min(MAX_TIMEOUT_MS, get_settings().max_job_timeout_s * 1000)


def capped_timeout(timeout: int | None) -> int | None:
    """``timeout`` if it is within ``timeout_cap_ms``; else a ``ValueError`` naming the cap."""
    if timeout is None:
        return None
    cap = timeout_cap_ms()
    if timeout > cap:
        raise ValueError(
            f"timeout must be at most {cap} ms (KEEL_MAX_JOB_TIMEOUT_S={cap // 1000}): a"
            " longer run would outlast the workers' shutdown grace"
        )
    return timeout


def _state_the_cap(schema: dict[str, Any]) -> None:
    """The JSON Schema of ``timeout`` states the cap in force when the document is built."""
    for variant in [schema, *schema.get("anyOf", [])]:
        if variant.get("type") == "integer":
            variant["maximum"] = timeout_cap_ms()


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Backoff(_Options):
    """How long to wait before the next run after a failed one."""

    type: Literal["fixed", "exponential"] = "fixed"
    delay: int = Field(default=0, ge=0, description="base delay in milliseconds")
    jitter: float = Field(default=0.0, ge=0.0, le=1.0)


class KeepJobs(_Options):
    """Retention of finished records: the newest ``count``, none older than ``age`` s."""

    count: int | None = Field(default=None, ge=0)
    age: int | None = Field(default=None, ge=0)


class Deduplication(_Options):
    """BullMQ's deduplication: simple (id), throttle (ttl), debounce (extend/replace)."""

    id: str = Field(min_length=1, max_length=200)
    ttl: int | None = Field(default=None, gt=0, description="milliseconds")
    extend: bool = False
    replace: bool = False


class JobOptions(_Options):
    """Options of one job, stored with its record."""

    attempts: int = Field(default=1, ge=1, le=100)
    backoff: Backoff | None = None
    delay: int = Field(default=0, ge=0, description="milliseconds before the job may run")
    job_id: str | None = Field(default=None, alias="jobId", min_length=1, max_length=200)
    # Unset: the global default ages (``KEEL_KEEP_COMPLETED_S`` / ``KEEL_KEEP_FAILED_S``,
    # ``tasks.jobs.upkeep.retention``); ``False`` keeps this job's records for ever.
    remove_on_complete: bool | int | KeepJobs | None = Field(default=None, alias="removeOnComplete")
    remove_on_fail: bool | int | KeepJobs | None = Field(default=None, alias="removeOnFail")
    deduplication: Deduplication | None = None
    max_retries: int | None = Field(
        default=None,
        alias="maxRetries",
        ge=0,
        le=99,
        description="a Celery task's retries (``self.retry``, ``autoretry_for``): at most this"
        " many; set from the task's ``max_retries`` (``attempts`` counts runs Keel retries on its"
        " own, BullMQ's way)",
    )
    expires_at: datetime | None = Field(
        default=None,
        alias="expiresAt",
        description="a job not started by then fails with 'expired' (Celery's ``expires``)",
    )
    timeout: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TIMEOUT_MS,
        description="milliseconds a run may take: past it the run is ended and failed as timed"
        " out, and the job runs again by its attempts and backoff (Celery's ``time_limit``,"
        " which a call's ``time_limit=`` replaces); at most ``KEEL_MAX_JOB_TIMEOUT_S``",
        json_schema_extra=_state_the_cap,
    )

    concurrency_key: str | None = Field(
        default=None,
        alias="concurrencyKey",
        min_length=1,
        max_length=200,
        description="the job's key for its type's key concurrency, instead of the one its data"
        " gives; on a type that declares none, one job of the key runs at a time, in line",
    )

    @field_validator("timeout")
    @classmethod
    def _timeout_within_the_cap(cls, timeout: int | None, info: ValidationInfo) -> int | None:
        # A record's timeout was allowed when its job was added: a lower cap since does not
        # fail the job when it is claimed or ended.
        if (info.context or {}).get("stored"):
            return timeout
        return capped_timeout(timeout)

    def stored(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def columns(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The options as a record keeps them: ``jobs.opts`` (the keys of ``RECORD_KEYS``) and
        ``jobs.extra_opts`` (those added since, or ``None``).

        A worker of the previous release parses ``jobs.opts`` with a model that refuses keys
        it does not know, so a key it lacks there would fail the job on that worker during a
        rolling upgrade; it never reads ``jobs.extra_opts``.
        """
        if not self.model_fields_set and type(self) is JobOptions:  # all left as they are
            return dict(_DEFAULT_STORED), None  # (most bulk adds' jobs)
        return self._columns()

    def _columns(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        stored = self.stored()
        extra = {key: stored.pop(key) for key in list(stored) if key not in RECORD_KEYS}
        return stored, extra or None

    @classmethod
    def from_stored(
        cls, stored: dict[str, Any] | None, extra: dict[str, Any] | None = None
    ) -> JobOptions:
        """The options kept with a record (``jobs.opts`` and ``jobs.extra_opts``), parsed once
        when its job is claimed. A key of ``extra`` this release does not know (a later
        release's option, during an upgrade) is left out: this release cannot honour it."""
        known = {key: value for key, value in (extra or {}).items() if key in _ALIASES}
        return cls.model_validate({**(stored or {}), **known}, context=STORED)

    def retention(self, completed: bool) -> Retention | None:
        """What the end of a job of this kind trims (``None``: nothing; an unset option is the
        periodic sweep's, ``tasks.jobs.upkeep.retention``)."""
        return Retention.of(self.remove_on_complete if completed else self.remove_on_fail)

    def retry_in_ms(self, failures: int) -> int | None:
        """Milliseconds until the next run after ``failures`` failed runs; ``None``: no more."""
        if failures >= self.attempts:
            return None
        return backoff_delay_ms(self.backoff, failures)


# The keys ``jobs.opts`` holds: the options every release since v0.3.0 reads (its
# ``JobOptions``). An option added later is kept in ``jobs.extra_opts`` (``columns``), which a
# release reads leniently; moving it here needs a new record format (``tasks.jobs.model.formats``).
RECORD_KEYS = frozenset(
    {
        "attempts",
        "backoff",
        "delay",
        "jobId",
        "removeOnComplete",
        "removeOnFail",
        "deduplication",
        "expiresAt",
    }
)
_ALIASES = frozenset(field.alias or name for name, field in JobOptions.model_fields.items())
# ``jobs.opts`` of a job given no options (the defaults hold no key for ``jobs.extra_opts``).
_DEFAULT_STORED = JobOptions()._columns()[0]


@dataclass(frozen=True)
class Retention:
    """Keep the newest ``count`` finished records, none older than ``age_s`` (None: no bound)."""

    count: int | None
    age_s: int | None

    @classmethod
    def of(cls, setting: bool | int | KeepJobs | None) -> Retention | None:
        """BullMQ's forms: ``False`` keeps all, ``True`` none, ``n`` n, ``{count, age}``."""
        if setting is None or setting is False:
            return None
        if setting is True:
            return cls(0, None)
        if isinstance(setting, int):
            return cls(setting, None)
        return cls(setting.count, setting.age)


def backoff_max_ms(backoff: Backoff, failures: int) -> float:
    """The longest wait after the ``failures``-th failed run (1-based)."""
    if backoff.type == "fixed":
        return float(backoff.delay)
    return math.pow(2, failures - 1) * backoff.delay


def backoff_delay_ms(
    backoff: Backoff | None, failures: int, rng: random.Random | None = None
) -> int:
    """BullMQ's rule: the maximum, or a uniform pick in ``[(1-j)·max, max]`` with jitter ``j``."""
    if backoff is None:
        return 0
    maximum = backoff_max_ms(backoff, failures)
    if backoff.jitter <= 0:
        return int(maximum)
    low = maximum * (1 - backoff.jitter)
    return math.floor((rng or random).random() * maximum * backoff.jitter + low)
