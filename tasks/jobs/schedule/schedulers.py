"""Job schedulers in Postgres, fired by Celery beat (see ``tasks.jobs.schedule.beat``).

Upserting by a stable id updates, never duplicates. Every fire adds a job
whose id derives from (tenant, scheduler id, fire time), so any number of
beat processes — or a beat restarted mid-fire — produce exactly one job per
scheduled time: the second add of the same id adds nothing. Firing is
``tasks.jobs.schedule.firing``; this module stores, reads, pauses and resumes.

A scheduler's policies (``schedule_rules.Policy``: overlap, catch-up, jitter, paused) are
kept in their own column; a paused scheduler has no next fire, and resumed, it fires at its
next slot after now (the slots it missed are not caught up, as in Temporal).

A template is judged at upsert like an API call (``registry.check_template``):
a tenant may only schedule jobs declared schedulable by tenants, and the jobs
it fires are owned by the scheduler's tenant and user, under the tenant's
quota — identity never comes from the template's data.

A system scheduler may instead send a plain Celery task message at each fire
(``celeryMessage``: what a ``beat_schedule`` entry naming a task that is not a
Keel job becomes, see ``tasks.jobs.schedule.beat_entries``). No record is kept for such
a message; the row lock still makes it one message per scheduled time, sent
before the fire is committed (a commit that then fails sends that fire again).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from tasks.jobs.intake import tenancy
from tasks.jobs.model import registry
from tasks.jobs.model.errors import InvalidId, JobNotFound
from tasks.jobs.model.models import JobSchedulerRecord
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.schedule_rules import (
    JobTemplate,
    Policy,
    Rule,
    first_fire,
    next_fire,
    policy_of,
)
from tasks.jobs.observe.queries import iso
from tasks.platform.db import transaction
from tasks.platform.ids import has_control
from tasks.platform.setting_types import Quota

log = logging.getLogger(__name__)
SYSTEM = ""  # the tenant of schedulers managed by the CLI and at startup
# A tenant's scheduler id: what the API's path and the dashboard's form take (``web.schedulers``
# documents it as ``^...$``), checked with ``fullmatch``: ``re.match`` with ``$`` also takes
# "nightly\n". A system scheduler's id (a beat_schedule entry's name) may hold any other text.
TENANT_ID_RULE = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}"
_TENANT_ID = re.compile(TENANT_ID_RULE)
MAX_ID = 200  # job_schedulers.id


class SchedulerSpec(Rule, Policy):
    """A rule plus the job template it fires, and its policies (kept apart when stored)."""

    template: JobTemplate

    @model_validator(mode="after")
    def _bounded_catch_up(self) -> SchedulerSpec:
        """``catchUp: all`` fires each missed slot: without a window, a beat away for an hour
        would leave a 100 ms scheduler 36,000 of them to fire."""
        if self.catchUp == "all" and self.catchUpWindow is None:
            raise ValueError(
                "catchUpWindow is required with catchUp all (ms: older missed slots never fire)"
            )
        return self


class CeleryMessage(BaseModel):
    """A plain Celery task message, sent as is at each fire (no job record is kept)."""

    model_config = ConfigDict(extra="forbid")

    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)


class StoredSpec(SchedulerSpec):
    """What a scheduler row holds: a spec, or for a system scheduler a plain Celery message
    to send instead of adding a job. Only ``upsert_plain`` writes one; the API and the CLI
    build ``SchedulerSpec``, which refuses the field."""

    celeryMessage: CeleryMessage | None = None


@dataclass(frozen=True)
class Scope:
    """Whose schedulers: a tenant (``SYSTEM`` for the operators' own)."""

    tenant_id: str = SYSTEM
    actor: str | None = None


def fire_prefix(tenant_id: str, scheduler_id: str) -> str:
    """``repeat:<digest>:`` — a digest of both parts, so no two (tenant, id) pairs share it
    (``X`` + ``ops:nightly`` and ``X:ops`` + ``nightly`` would, joined with ``:``) and the
    job id stays short whatever the ids' lengths."""
    digest = hashlib.sha256(json.dumps([tenant_id, scheduler_id]).encode()).hexdigest()[:32]
    return f"repeat:{digest}:"


def fire_job_id(tenant_id: str, scheduler_id: str, at: datetime) -> str:
    return f"{fire_prefix(tenant_id, scheduler_id)}{int(at.timestamp() * 1000)}"


def db_now(session: Session) -> datetime:
    now: datetime = session.execute(text("SELECT clock_timestamp()")).scalar_one()
    return now


def upsert(
    scope: Scope,
    scheduler_id: str,
    spec: SchedulerSpec,
    queue: str | None = None,
    quota: Quota | None = None,
) -> JobSchedulerRecord:
    """Create or update; an unchanged rule keeps its next fire time (safe to call at boot),
    and a parked scheduler (``next`` null before its limit) gets one again.

    The id is checked first (``InvalidId``), then the template (``TemplateRefused``); a
    tenant's new scheduler beyond ``quota.schedulers`` is refused (``QuotaExceeded``).
    """
    check_id(scope, scheduler_id)
    template = spec.template
    tenant = scope.tenant_id != SYSTEM
    job_type = registry.check_template(template.name, template.data, queue, tenant=tenant)
    if quota is not None and template.opts.delay + spec.jitter > quota.jobs.max_delay_ms:
        raise tenancy.delay_too_long(quota.jobs)
    return _save(scope, scheduler_id, spec, job_type.queue, quota)


def upsert_plain(scheduler_id: str, spec: StoredSpec, queue: str) -> JobSchedulerRecord:
    """A system scheduler that sends ``spec.celeryMessage`` (a task no job type declares)."""
    if spec.celeryMessage is None:
        raise ValueError("a plain scheduler needs a celeryMessage")
    check_id(Scope(), scheduler_id)
    return _save(Scope(), scheduler_id, spec, queue, None)


def check_id(scope: Scope, scheduler_id: str) -> str:
    """``scheduler_id`` if every way to name a scheduler of ``scope`` again can (``InvalidId``):
    a tenant's by the API's rule, any by no control character or line break
    (``tasks.platform.ids``)."""
    if scope.tenant_id != SYSTEM and not _TENANT_ID.fullmatch(scheduler_id):
        raise InvalidId(
            f"{scheduler_id!r} is not a scheduler id: 1..{MAX_ID} of A-Z a-z 0-9 . _ : -, "
            "starting with a letter or digit"
        )
    if not 1 <= len(scheduler_id) <= MAX_ID or has_control(scheduler_id):
        raise InvalidId(
            f"{scheduler_id!r} is not a scheduler id: 1..{MAX_ID} characters, "
            "no control character or line break"
        )
    return scheduler_id


POLICY_FIELDS = set(Policy.model_fields)


def _save(
    scope: Scope, scheduler_id: str, spec: SchedulerSpec, queue: str, quota: Quota | None
) -> JobSchedulerRecord:
    stored = spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude=POLICY_FIELDS)
    policy = Policy.model_validate(spec.model_dump(include=POLICY_FIELDS))
    # The template's options the previous release reads stay in the spec; newer ones apart.
    base_opts, extra_opts = spec.template.opts.columns()
    stored["template"] = {**stored["template"], "opts": base_opts}
    with transaction() as session:
        now = db_now(session)
        record = session.get(
            JobSchedulerRecord, (scope.tenant_id, scheduler_id), with_for_update=True
        )
        new = record is None
        if record is None:
            if quota is not None:
                _check_room(session, scope.tenant_id, quota.schedulers)
            record = JobSchedulerRecord(
                tenant_id=scope.tenant_id, id=scheduler_id, iteration_count=0
            )
            session.add(record)
        rule_changed = new or _rule_of(record.spec) != _rule_of(stored) or spec.immediately
        # A parked scheduler (no next fire, its limit not reached) starts again when saved:
        # its template may be fixed now, and what parked it may have passed.
        parked = record.next_run_at is None and (
            spec.limit is None or record.iteration_count < spec.limit
        )
        was = policy_of(record.policy)
        record.queue = queue
        record.spec = stored
        record.extra_opts = extra_opts
        record.created_by = scope.actor
        record.updated_at = now
        paused = was.paused if policy.paused is None else policy.paused
        record.policy = policy.model_copy(update={"paused": paused or None}).stored()
        record.held_since = None  # a slot still held is held again at the next round
        if paused:
            record.next_run_at = None
        elif rule_changed or (parked and not was.paused):
            record.next_run_at = first_fire(spec, now, new=new)
        elif was.paused:
            record.next_run_at = next_fire(spec, now, None)
        session.flush()
        return record


def set_paused(scope: Scope, scheduler_id: str, paused: bool) -> JobSchedulerRecord:
    """Pause (no fire, ``next`` null) or resume (the next slot after now) a scheduler;
    asking for the state it is in changes nothing."""
    with transaction() as session:
        record = session.get(
            JobSchedulerRecord, (scope.tenant_id, scheduler_id), with_for_update=True
        )
        if record is None:
            raise JobNotFound("job scheduler not found")
        was = policy_of(record.policy)
        if bool(was.paused) == paused:
            return record
        now = db_now(session)
        record.policy = was.model_copy(update={"paused": paused or None}).stored()
        record.updated_at = now
        record.held_since = None
        if paused:
            record.next_run_at = None
        else:
            spec = Rule.model_validate(_rule_of(record.spec))
            limit_left = spec.limit is None or record.iteration_count < spec.limit
            record.next_run_at = next_fire(spec, now, None) if limit_left else None
        session.flush()
        return record


def _check_room(session: Session, tenant_id: str, limit: int) -> None:
    tenancy.lock(session, tenant_id, "schedulers")
    held = session.scalar(select(func.count()).where(JobSchedulerRecord.tenant_id == tenant_id))
    if held is not None and held >= limit:
        raise tenancy.exceeded(
            "schedulers", limit, held, f"the tenant has {held} job schedulers, its quota is {limit}"
        )


def _rule_of(stored: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stored.items() if k not in ("template", "celeryMessage")}


def remove(scope: Scope, scheduler_id: str) -> None:
    with transaction() as session:
        record = session.get(JobSchedulerRecord, (scope.tenant_id, scheduler_id))
        if record is None:
            raise JobNotFound("job scheduler not found")
        session.delete(record)


def remove_system_except(prefix: str, keep: set[str]) -> list[str]:
    """Remove the system schedulers whose id starts with ``prefix``, except ``keep``."""
    with transaction() as session:
        gone = session.scalars(
            delete(JobSchedulerRecord)
            .where(
                JobSchedulerRecord.tenant_id == SYSTEM,
                JobSchedulerRecord.id.startswith(prefix, autoescape=True),
                JobSchedulerRecord.id.not_in(keep),
            )
            .returning(JobSchedulerRecord.id)
        ).all()
    return sorted(gone)


def get(scope: Scope, scheduler_id: str) -> JobSchedulerRecord:
    with transaction() as session:
        record = session.get(JobSchedulerRecord, (scope.tenant_id, scheduler_id))
    if record is None:
        raise JobNotFound("job scheduler not found")
    return record


def list_all(scope: Scope | None = None) -> list[JobSchedulerRecord]:
    """The scope's schedulers, or every scheduler when ``scope`` is None (CLI)."""
    query = select(JobSchedulerRecord).order_by(JobSchedulerRecord.tenant_id, JobSchedulerRecord.id)
    if scope is not None:
        query = query.where(JobSchedulerRecord.tenant_id == scope.tenant_id)
    with transaction() as session:
        return list(session.scalars(query))


def spec_of(record: JobSchedulerRecord) -> dict[str, Any]:
    """The scheduler's stored spec, its template's options whole again (``extra_opts``)."""
    if not record.extra_opts:
        return record.spec
    template = dict(record.spec.get("template") or {})
    opts = JobOptions.from_stored(template.get("opts"), record.extra_opts)
    return {**record.spec, "template": {**template, "opts": opts.stored()}}


def describe(record: JobSchedulerRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "queue": record.queue,
        **spec_of(record),
        **policy_of(record.policy).view(),
        "iterationCount": record.iteration_count,
        "next": iso(record.next_run_at),
        "lastRunAt": iso(record.last_run_at),
        "createdAt": iso(record.created_at),
        "updatedAt": iso(record.updated_at),
    }
