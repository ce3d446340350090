"""Job schedulers in Postgres, fired by Celery beat (see ``tasks.jobs.schedule.beat``).

Upserting by a stable id updates, never duplicates. Every fire adds a job
whose id derives from (tenant, scheduler id, fire time), so any number of
beat processes — or a beat restarted mid-fire — produce exactly one job per
scheduled time: the second add of the same id adds nothing.

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
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from tasks.jobs.intake import tenancy
from tasks.jobs.intake.enqueue import AddedJob, add
from tasks.jobs.intake.messages import PUBLISH_RETRY
from tasks.jobs.model import registry
from tasks.jobs.model.errors import InvalidId, JobNotFound, QuotaExceeded
from tasks.jobs.model.models import JobSchedulerRecord
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner
from tasks.jobs.model.schedule_rules import JobTemplate, Rule, first_fire, next_fire
from tasks.jobs.observe.queries import iso
from tasks.platform import broker
from tasks.platform.celery_app import app
from tasks.platform.db import passing, transaction
from tasks.platform.ids import has_control
from tasks.platform.setting_types import Quota, TenantLimits

log = logging.getLogger(__name__)
SYSTEM = ""  # the tenant of schedulers managed by the CLI and at startup
# A tenant's scheduler id: what the API's path and the dashboard's form take (``web.schedulers``
# documents it as ``^...$``), checked with ``fullmatch``: ``re.match`` with ``$`` also takes
# "nightly\n". A system scheduler's id (a beat_schedule entry's name) may hold any other text.
TENANT_ID_RULE = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}"
_TENANT_ID = re.compile(TENANT_ID_RULE)
MAX_ID = 200  # job_schedulers.id


class SchedulerSpec(Rule):
    """A rule plus the job template it fires (the stored form of a scheduler)."""

    template: JobTemplate


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


class PublishFailed(Exception):
    """A plain Celery message could not be sent: this fire is tried again at the next tick."""


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


def _now(session: Session) -> datetime:
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
    if quota is not None and template.opts.delay > quota.jobs.max_delay_ms:
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


def _save(
    scope: Scope, scheduler_id: str, spec: SchedulerSpec, queue: str, quota: Quota | None
) -> JobSchedulerRecord:
    stored = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    # The template's options the previous release reads stay in the spec; newer ones apart.
    base_opts, extra_opts = spec.template.opts.columns()
    stored["template"] = {**stored["template"], "opts": base_opts}
    with transaction() as session:
        now = _now(session)
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
        record.queue = queue
        record.spec = stored
        record.extra_opts = extra_opts
        record.created_by = scope.actor
        record.updated_at = now
        if rule_changed or parked:
            record.next_run_at = first_fire(spec, now, new=new)
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


def _fire(
    session: Session, record: JobSchedulerRecord, now: datetime, limits: TenantLimits | None
) -> str | None:
    spec = StoredSpec.model_validate(spec_of(record))
    at = record.next_run_at
    assert at is not None
    if spec.limit is not None and record.iteration_count >= spec.limit:
        record.next_run_at = None
        return None
    if spec.celeryMessage is not None:
        _send(record, spec.template.name, spec.celeryMessage, at)
        added = None
    else:
        added = _add(record, spec.template, at, limits)
    record.iteration_count += 1
    record.last_run_at = at
    done = spec.limit is not None and record.iteration_count >= spec.limit
    record.next_run_at = None if done else next_fire(spec, max(at, now), at)
    return added.job_id if added is not None and added.created else None


def _add(
    record: JobSchedulerRecord, template: JobTemplate, at: datetime, limits: TenantLimits | None
) -> AddedJob | None:
    opts = template.opts.model_copy(update={"job_id": fire_job_id(record.tenant_id, record.id, at)})
    owner = Owner(record.tenant_id, record.created_by or "scheduler") if record.tenant_id else None
    try:
        return add(
            template.name,
            template.data,
            queue=record.queue,
            opts=opts,
            owner=owner,
            limits=limits if owner else None,
        )
    except QuotaExceeded as refused:  # this fire is skipped; the scheduler goes on
        log.warning(
            "scheduler %s/%s skipped the fire at %s: %s",
            record.tenant_id,
            record.id,
            at.isoformat(),
            refused,
        )
        return None


def _send(record: JobSchedulerRecord, name: str, message: CeleryMessage, at: datetime) -> None:
    """Send a plain Celery message for this fire (its task id derives from the fire time).

    Sent inside the firing transaction, like a promoted job's message: a beat
    that dies before its commit leaves the fire due, and the next beat sends
    it again — at least once, never silently lost. A broker that does not
    answer raises ``PublishFailed`` and the fire stays due.
    """
    if record.tenant_id != SYSTEM:  # only upsert_plain writes these, in the system scope
        raise ValueError("only system schedulers send plain Celery messages")
    options = {
        "task_id": fire_job_id(record.tenant_id, record.id, at),
        "retry": True,
        "retry_policy": PUBLISH_RETRY,
        **message.options,
    }
    if broker.publish_unreachable():
        raise PublishFailed("the broker is unreachable")
    started = time.monotonic()
    try:
        broker.publish(
            lambda producer: app.send_task(
                name, args=message.args, kwargs=message.kwargs, producer=producer, **options
            )
        )
    except Exception as exc:
        broker.publish_failed(exc, started)
        raise PublishFailed(str(exc)) from exc
    log.info("scheduler %s sent %s[%s]", record.id, name, options["task_id"])


@dataclass
class FireRound:
    """What one round of firing did: the jobs it added, and fires left due (unsent: the
    broker or the store failed them for now, and the next round tries them again)."""

    job_ids: list[str]
    unsent: int = 0
    names: dict[str, str] = field(default_factory=dict)  # job id -> job name


def fire_due(limit: int = 100, job_limits: TenantLimits | None = None) -> FireRound:
    """Fire every scheduler whose time has come."""
    fired = FireRound([])
    with transaction() as session:
        now = _now(session)
        due = session.scalars(
            select(JobSchedulerRecord)
            .where(JobSchedulerRecord.next_run_at <= now)
            .order_by(JobSchedulerRecord.next_run_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        for record in due:
            try:
                with session.begin_nested():  # one broken scheduler must not stop the others
                    job_id = _fire(session, record, now, job_limits)
            except PublishFailed as exc:
                log.warning("scheduler %s could not send its message; retrying: %s", record.id, exc)
                fired.unsent += 1
                continue
            except Exception as exc:
                if not passing(exc):
                    log.exception(
                        "scheduler %s/%s could not fire; parked", record.tenant_id, record.id
                    )
                    _park(session, record)
                    continue
                # A deadlock, a lock or statement timeout, the database away: the fire stays
                # due and the next tick tries it again (a job it did insert, on its own
                # connection, is found by its id then). Parking is for a fire that can never
                # work, not a passing error.
                log.warning(
                    "scheduler %s/%s did not fire; retrying: %s", record.tenant_id, record.id, exc
                )
                fired.unsent += 1
                continue
            if job_id:
                fired.job_ids.append(job_id)
                fired.names[job_id] = str(record.spec.get("template", {}).get("name", ""))
    return fired


def _park(session: Session, record: JobSchedulerRecord) -> None:
    """A scheduler whose next fire cannot be computed stops firing (visible as next = null)."""
    session.execute(
        text("UPDATE job_schedulers SET next_run_at = NULL WHERE tenant_id = :t AND id = :i"),
        {"t": record.tenant_id, "i": record.id},
    )


def seconds_until_next(cap: float) -> float:
    with transaction() as session:
        row = session.execute(
            text(
                "SELECT EXTRACT(EPOCH FROM min(next_run_at) - clock_timestamp()) "
                "FROM job_schedulers WHERE next_run_at IS NOT NULL"
            )
        ).scalar()
    if row is None:
        return cap
    return max(0.0, min(cap, float(row)))


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
        "iterationCount": record.iteration_count,
        "next": iso(record.next_run_at),
        "lastRunAt": iso(record.last_run_at),
        "createdAt": iso(record.created_at),
        "updatedAt": iso(record.updated_at),
    }
