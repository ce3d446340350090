"""Firing job schedulers: each due slot once, by its policies; and a fire on request (run now).

Beat (``tasks.jobs.schedule.beat``) calls ``fire_due`` at every tick. Due rows are locked
with SKIP LOCKED and each fire's job id derives from (tenant, scheduler id, slot), so any
number of beats add one job per slot. What a slot does follows the scheduler's
``Policy`` (``tasks.jobs.model.schedule_rules``):

- which slot fires after downtime (``catchUp``, ``catchUpWindow``: ``due_slot``);
- what it does while the scheduler's last job is live (``overlap``): the last job is the
  one of its last fire (``last_run_at``), read by its derived id — a skipped fire does not
  move it, so under ``skip``, ``buffer`` and ``cancel`` it is the only live one. A
  ``buffer`` slot stays due (``next_run_at`` in the past, ``held_since`` set) and is fired
  by the first tick after that job ends; ``FireRound.held`` tells beat to look again
  shortly, not at once;
- ``jitter``: the job is added delayed by its slot's share of it.

A round fires at most ``limit`` slots, and no set of schedulers can keep the others out of
it: the due slots that are not held come first, those on time before those of a scheduler
catching up a backlog (``catchUp: all``, more than ``BEHIND`` late), oldest first; then,
with what is left of the round, the held slots whose last job has ended — all held slots
are checked at once (two queries however many), so one still held takes no room.

A plain Celery message (a ``beat_schedule`` entry that is no Keel job) leaves no record
to watch: its overlap is always ``allow`` (``beat_entries`` refuses another). It is sent
inside the firing transaction: a beat that dies before its commit leaves the fire due,
and the next beat sends it again — at least once, never silently lost.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import ColumnElement, Select, func, select, text, tuple_
from sqlalchemy.orm import Session

from tasks.jobs.end import cancel
from tasks.jobs.intake.enqueue import AddedJob, add
from tasks.jobs.intake.messages import PUBLISH_RETRY
from tasks.jobs.model.errors import JobConflict, JobNotFound, QuotaExceeded
from tasks.jobs.model.models import LIVE_STATES, JobRecord, JobSchedulerRecord
from tasks.jobs.model.owner import Owner
from tasks.jobs.model.schedule_rules import (
    Policy,
    after_fire,
    due_slot,
    jitter_ms,
    last_slot,
    next_fire,
    policy_of,
)
from tasks.jobs.schedule.schedulers import (
    SYSTEM,
    CeleryMessage,
    Scope,
    StoredSpec,
    db_now,
    fire_job_id,
    spec_of,
)
from tasks.platform import broker
from tasks.platform.celery_app import app
from tasks.platform.db import passing, transaction
from tasks.platform.setting_types import TenantLimits

log = logging.getLogger(__name__)
Outcome = Literal["added", "sent", "skipped", "buffered"]
# A ``catchUp: all`` scheduler whose due slot is older than this is catching up a backlog:
# its slots yield to the slots on time of every other scheduler.
BEHIND = timedelta(seconds=1)


class PublishFailed(Exception):
    """A plain Celery message could not be sent: this fire is tried again at the next tick."""


@dataclass(frozen=True)
class Fired:
    """What one fire did, and the job it added (or the message's task id)."""

    outcome: Outcome
    job_id: str | None = None


@dataclass
class FireRound:
    """What one round of firing did: the jobs it added, fires left due (unsent: the broker
    or the store failed them for now, and the next round tries them again), and slots held
    by ``buffer`` until their scheduler's last job ends."""

    job_ids: list[str]
    unsent: int = 0
    names: dict[str, str] = field(default_factory=dict)  # job id -> job name
    held: int = 0


def fire_due(limit: int = 100, job_limits: TenantLimits | None = None) -> FireRound:
    """Fire every scheduler whose time has come, at most ``limit`` of them: the slots not
    held first (on time before backlogs, oldest first), then the held slots that can fire."""
    fired = FireRound([])
    with transaction() as session:
        now = db_now(session)
        catching_up = func.coalesce(
            (JobSchedulerRecord.policy["catchUp"].astext == "all")
            & (JobSchedulerRecord.next_run_at < now - BEHIND),
            False,
        )
        due = _locked(
            session,
            select(JobSchedulerRecord)
            .where(JobSchedulerRecord.next_run_at <= now, JobSchedulerRecord.held_since.is_(None))
            .order_by(catching_up, JobSchedulerRecord.next_run_at)
            .limit(limit),
        )
        for record in due:
            _fire_one(session, record, now, job_limits, fired)
        room = limit - len(due)
        if room > 0:
            seen = {(record.tenant_id, record.id) for record in due}  # held by this round
            for record in _released(session, now, room, seen, fired):
                _fire_one(session, record, now, job_limits, fired)
    return fired


def _locked(session: Session, query: Select[JobSchedulerRecord]) -> list[JobSchedulerRecord]:
    return list(session.scalars(query.with_for_update(skip_locked=True)).all())


def _released(
    session: Session, now: datetime, room: int, seen: set[tuple[str, str]], fired: FireRound
) -> list[JobSchedulerRecord]:
    """Up to ``room`` held slots that may fire now (their scheduler's last job has ended),
    locked; the others, still held, are counted in ``fired.held`` and left untouched
    (``seen``: the slots this round looked at already)."""
    held_now: ColumnElement[bool] = JobSchedulerRecord.held_since.is_not(None) & (
        JobSchedulerRecord.next_run_at <= now
    )
    columns = JobSchedulerRecord.tenant_id, JobSchedulerRecord.id, JobSchedulerRecord.last_run_at
    held = [
        (tenant, scheduler_id, at)
        for tenant, scheduler_id, at in session.execute(select(*columns).where(held_now))
        if (tenant, scheduler_id) not in seen
    ]
    if not held:
        return []
    last = {fire_job_id(t, i, at): (t, i) for t, i, at in held if at is not None}
    live = session.scalars(
        select(JobRecord.id).where(JobRecord.id.in_(last), JobRecord.state.in_(LIVE_STATES))
    )
    waiting = {last[job_id] for job_id in live}
    fired.held += len(waiting)
    free = [(t, i) for t, i, _ in held if (t, i) not in waiting]
    if not free:
        return []
    return _locked(
        session,
        select(JobSchedulerRecord)
        .where(held_now, tuple_(JobSchedulerRecord.tenant_id, JobSchedulerRecord.id).in_(free))
        .order_by(JobSchedulerRecord.held_since, JobSchedulerRecord.next_run_at)
        .limit(room),
    )


def _fire_one(
    session: Session,
    record: JobSchedulerRecord,
    now: datetime,
    job_limits: TenantLimits | None,
    fired: FireRound,
) -> None:
    try:
        with session.begin_nested():  # one broken scheduler must not stop the others
            done = _fire(session, record, now, job_limits)
    except PublishFailed as exc:
        log.warning("scheduler %s could not send its message; retrying: %s", record.id, exc)
        fired.unsent += 1
        return
    except Exception as exc:
        if not passing(exc):
            log.exception("scheduler %s/%s could not fire; parked", record.tenant_id, record.id)
            _park(session, record)
            return
        # A deadlock, a lock or statement timeout, the database away: the fire stays
        # due and the next tick tries it again (a job it did insert, on its own
        # connection, is found by its id then). Parking is for a fire that can never
        # work, not a passing error.
        log.warning("scheduler %s/%s did not fire; retrying: %s", record.tenant_id, record.id, exc)
        fired.unsent += 1
        return
    if done is None:
        return
    if done.outcome == "buffered":
        fired.held += 1
    elif done.outcome == "added" and done.job_id:
        fired.job_ids.append(done.job_id)
        fired.names[done.job_id] = str(record.spec.get("template", {}).get("name", ""))


def _fire(
    session: Session, record: JobSchedulerRecord, now: datetime, limits: TenantLimits | None
) -> Fired | None:
    spec = StoredSpec.model_validate(spec_of(record))
    policy = policy_of(record.policy)
    due = record.next_run_at
    assert due is not None
    held_since, record.held_since = record.held_since, None  # unless it is held again below
    if spec.limit is not None and record.iteration_count >= spec.limit:
        record.next_run_at = None
        return None
    at = due_slot(spec, policy, due, now)
    if at is None:  # every missed slot is older than the catch-up window
        log.info("scheduler %s/%s: missed slots outside catchUpWindow", record.tenant_id, record.id)
        record.next_run_at = next_fire(spec, now, due)
        return None
    busy = _in_the_way(session, record, policy)
    if busy is not None and policy.overlap == "buffer":
        # Held: the slot stays due; slots passing meanwhile collapse into it (one held).
        record.next_run_at = last_slot(spec, due, now) if policy.catchUp == "all" else due
        record.held_since = held_since or now
        return Fired("buffered")
    if busy is not None and policy.overlap == "skip":
        log.info("scheduler %s/%s skipped %s: %s is live", record.tenant_id, record.id, at, busy)
        record.next_run_at = next_fire(spec, max(at, now), at)
        return Fired("skipped")
    done = _fire_at(record, spec, at, limits, jitter=jitter_ms(policy, _fire_id(record, at)))
    record.iteration_count += 1
    record.last_run_at = at
    finished = spec.limit is not None and record.iteration_count >= spec.limit
    record.next_run_at = None if finished else after_fire(spec, policy, at, now)
    return done


def _fire_id(record: JobSchedulerRecord, at: datetime) -> str:
    return fire_job_id(record.tenant_id, record.id, at)


def _in_the_way(session: Session, record: JobSchedulerRecord, policy: Policy) -> str | None:
    """The scheduler's last job if it is live and its policy is not ``allow`` — cancelled
    first under ``cancel``, and then no longer in the way."""
    if policy.overlap == "allow" or record.last_run_at is None or record.spec.get("celeryMessage"):
        return None
    last = _fire_id(record, record.last_run_at)
    state = session.scalar(select(JobRecord.state).where(JobRecord.id == last))
    if state not in LIVE_STATES:
        return None
    if policy.overlap != "cancel":
        return last
    with suppress(JobConflict, JobNotFound):  # it ended meanwhile
        cancel.cancel(last, None, actor=f"scheduler:{record.id}", reason="overlap cancel: new fire")
    return None


def _fire_at(
    record: JobSchedulerRecord,
    spec: StoredSpec,
    at: datetime,
    limits: TenantLimits | None,
    *,
    jitter: int = 0,
    refuse: bool = False,
) -> Fired:
    """Add the slot's job (or send its message); a tenant's quota skips it (``refuse``:
    raises ``QuotaExceeded`` instead, for a fire someone asked for)."""
    if spec.celeryMessage is not None:
        return Fired("sent", _send(record, spec.template.name, spec.celeryMessage, at, jitter))
    opts = spec.template.opts.model_copy(
        update={"job_id": _fire_id(record, at), "delay": spec.template.opts.delay + jitter}
    )
    owner = Owner(record.tenant_id, record.created_by or "scheduler") if record.tenant_id else None
    try:
        added: AddedJob = add(
            spec.template.name,
            spec.template.data,
            queue=record.queue,
            opts=opts,
            owner=owner,
            limits=limits if owner else None,
        )
    except QuotaExceeded as refused:  # this fire is skipped; the scheduler goes on
        if refuse:
            raise
        log.warning(
            "scheduler %s/%s skipped the fire at %s: %s",
            record.tenant_id,
            record.id,
            at.isoformat(),
            refused,
        )
        return Fired("skipped")
    return Fired("added", added.job_id if added.created else None)


def _send(
    record: JobSchedulerRecord, name: str, message: CeleryMessage, at: datetime, jitter: int
) -> str:
    """Send a plain Celery message for this fire (its task id derives from the fire time);
    a broker that does not answer raises ``PublishFailed`` and the fire stays due."""
    if record.tenant_id != SYSTEM:  # only upsert_plain writes these, in the system scope
        raise ValueError("only system schedulers send plain Celery messages")
    options = {
        "task_id": _fire_id(record, at),
        "retry": True,
        "retry_policy": PUBLISH_RETRY,
        **message.options,
    }
    if jitter and "eta" not in options:
        options["countdown"] = float(options.get("countdown") or 0) + jitter / 1000
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
    return str(options["task_id"])


def trigger(scope: Scope, scheduler_id: str, limits: TenantLimits | None = None) -> Fired:
    """Fire the scheduler now, outside its rule (Temporal's trigger-immediately), under its
    overlap policy, paused or not; its job's id derives from now. It does not count towards
    ``limit`` nor move the next slot — ``buffer`` excepted: with its last job live, the fire
    is held as the next slot, unless one is held already (then skipped). A tenant's quota
    refuses it (``QuotaExceeded``)."""
    with transaction() as session:
        record = session.get(
            JobSchedulerRecord, (scope.tenant_id, scheduler_id), with_for_update=True
        )
        if record is None:
            raise JobNotFound("job scheduler not found")
        now = db_now(session)
        spec = StoredSpec.model_validate(spec_of(record))
        policy = policy_of(record.policy)
        busy = _in_the_way(session, record, policy)
        if busy is not None and policy.overlap == "buffer":
            if record.next_run_at is None or record.next_run_at <= now:  # paused, or one held
                return Fired("skipped")
            record.next_run_at = now
            record.held_since = now
            return Fired("buffered")
        if busy is not None:
            return Fired("skipped")
        done = _fire_at(record, spec, now, limits, refuse=True)
        record.last_run_at = now
        return done


def _park(session: Session, record: JobSchedulerRecord) -> None:
    """A scheduler whose next fire cannot be computed stops firing (visible as next = null)."""
    session.execute(
        text(
            "UPDATE job_schedulers SET next_run_at = NULL, held_since = NULL "
            "WHERE tenant_id = :t AND id = :i"
        ),
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
