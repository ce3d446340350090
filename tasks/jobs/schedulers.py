"""Job schedulers in Postgres, fired by Celery beat (see ``tasks.jobs.beat``).

Upserting by a stable id updates, never duplicates. Every fire adds a job
whose id derives from (tenant, scheduler id, fire time), so any number of
beat processes — or a beat restarted mid-fire — produce exactly one job per
scheduled time: the second add of the same id adds nothing.

A template is judged at upsert like an API call (``registry.check_template``):
a tenant may only schedule jobs declared schedulable by tenants, and the jobs
it fires are owned by the scheduler's tenant and user, under the tenant's
quota — identity never comes from the template's data.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from tasks.db import transaction
from tasks.jobs import registry, tenancy
from tasks.jobs.enqueue import add
from tasks.jobs.errors import JobNotFound, QuotaExceeded
from tasks.jobs.models import JobSchedulerRecord
from tasks.jobs.owner import Owner
from tasks.jobs.queries import iso
from tasks.jobs.schedule_rules import JobTemplate, Rule, first_fire, next_fire
from tasks.jobs.tenancy import TenantLimits

log = logging.getLogger(__name__)
SYSTEM = ""  # the tenant of schedulers managed by the CLI and at startup


class SchedulerSpec(Rule):
    """A rule plus the job template it fires (the stored form of a scheduler)."""

    template: JobTemplate


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


@dataclass(frozen=True)
class Quota:
    """A tenant's limits on schedulers: how many, and the limits of the jobs they fire."""

    schedulers: int
    jobs: TenantLimits


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
    """Create or update; an unchanged rule keeps its next fire time (safe to call at boot).

    The template is checked first (``TemplateRefused``); a tenant's new scheduler
    beyond ``quota.schedulers`` is refused (``QuotaExceeded``).
    """
    template = spec.template
    tenant = scope.tenant_id != SYSTEM
    job_type = registry.check_template(template.name, template.data, queue, tenant=tenant)
    if quota is not None and template.opts.delay > quota.jobs.max_delay_ms:
        raise tenancy.delay_too_long(quota.jobs)
    stored = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
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
        record.queue = job_type.queue
        record.spec = stored
        record.created_by = scope.actor
        record.updated_at = now
        if rule_changed:
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
    return {k: v for k, v in stored.items() if k != "template"}


def remove(scope: Scope, scheduler_id: str) -> None:
    with transaction() as session:
        record = session.get(JobSchedulerRecord, (scope.tenant_id, scheduler_id))
        if record is None:
            raise JobNotFound("job scheduler not found")
        session.delete(record)


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
    spec = SchedulerSpec.model_validate(record.spec)
    at = record.next_run_at
    assert at is not None
    if spec.limit is not None and record.iteration_count >= spec.limit:
        record.next_run_at = None
        return None
    template = spec.template
    opts = template.opts.model_copy(update={"job_id": fire_job_id(record.tenant_id, record.id, at)})
    owner = Owner(record.tenant_id, record.created_by or "scheduler") if record.tenant_id else None
    try:
        added = add(
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
        added = None
    record.iteration_count += 1
    record.last_run_at = at
    done = spec.limit is not None and record.iteration_count >= spec.limit
    record.next_run_at = None if done else next_fire(spec, max(at, now), at)
    return added.job_id if added is not None and added.created else None


def fire_due(limit: int = 100, job_limits: TenantLimits | None = None) -> list[str]:
    """Fire every scheduler whose time has come; returns the ids of the jobs it added."""
    fired: list[str] = []
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
            except Exception:
                log.exception("scheduler %s/%s could not fire; parked", record.tenant_id, record.id)
                _park(session, record)
                continue
            if job_id:
                fired.append(job_id)
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


def describe(record: JobSchedulerRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "queue": record.queue,
        **record.spec,
        "iterationCount": record.iteration_count,
        "next": iso(record.next_run_at),
        "lastRunAt": iso(record.last_run_at),
        "createdAt": iso(record.created_at),
        "updatedAt": iso(record.updated_at),
    }
