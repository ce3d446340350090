"""Bulk actions: an operator acts on every job a filter matches (BullMQ's ``retryJobs``,
``promoteJobs``, ``clean``, ``drain``, ``obliterate``; Hatchet's bulk cancel and replay).

- ``retry``: failed jobs run again with their attempts, each audited as a manual retry
  is (``job_retry_audit``); jobs with a deduplication rule, and those of job types that
  declare retry rules of their own, are left out: retry those one at a time;
- ``cancel``: waiting, delayed or waiting-children jobs are cancelled;
- ``promote``: delayed jobs wait to run now;
- ``clean``: finished records (completed, failed, cancelled) are deleted, failed ones into
  the archive, as retention does;
- ``drain``: every waiting or delayed job of a queue is cancelled;
- ``obliterate`` (the system's scope only): every record of a queue is deleted, once the
  whole queue is paused and none of its jobs is running.

An action is asked once (``start``): its ``bulk_actions`` row records who, why, the
action, its filter and scope, and how many jobs matched then: that row is its audit. It
touches only jobs that were there when it was asked (created before it, or, for retry and
clean, finished before it), so jobs added or failing meanwhile are not drawn in, and it
visits each job once (its batches walk the jobs in id order from a cursor). Its work is
done in batches (``store.bulk.BATCH`` rows, one short transaction each, which commits the
batch's changes, the action's count and its cursor together), by whoever holds its row:
every worker's maintenance works a batch a tick (``work``), and ``keel jobs bulk`` works
its own action to the end. A process that dies mid-way loses nothing: the next holder goes
on where the last commit left it. A batch that fails (a row held too long, the database
away) is rolled back, noted on the action (``last_error``) and tried again after the
other running actions had their turn. A tenant operator's action matches only its
tenant's jobs, exactly as its single-job actions do.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.end import cancel as cancelling
from tasks.jobs.intake import manual_retry
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.errors import InvalidJobState, JobConflict, JobNotFound, Refused
from tasks.jobs.model.models import CANCELLABLE_STATES, FINISHED_STATES, BulkAction, State
from tasks.jobs.observe import events
from tasks.jobs.observe.queries import iso
from tasks.jobs.store import bulk as store
from tasks.jobs.store import pauses as pauses_store
from tasks.jobs.store import upkeep as upkeep_store
from tasks.jobs.store.bulk import BulkFilter as BulkFilter
from tasks.jobs.store.jobs import ReadyJob
from tasks.jobs.store.pauses import ALL_TENANTS
from tasks.platform.db import transaction

log = logging.getLogger(__name__)

MAINTENANCE_BATCHES = 1  # a worker's tick works this many batches at most
IDLE_WAIT_S = 0.5  # the command's pause while another process works its action
_NOW = text("SELECT clock_timestamp()")
Later = list[Callable[[], None]]  # what a batch announces once it commits


@dataclass(frozen=True)
class Action:
    """What a bulk action may touch, and what it does to a locked batch (its count)."""

    states: tuple[State, ...]  # those it may touch; a filter's ``state`` narrows them
    since: str  # the column that must predate the action: created_at or finished_on
    apply: Callable[[Session, list[str], BulkAction, Later], int]
    needs_queue: bool = False
    system_only: bool = False
    extra: str = ""  # a further condition on the jobs it touches
    extra_params: Callable[[], dict[str, Any]] | None = None  # ``extra``'s parameters


def _cancel(session: Session, ids: list[str], action: BulkAction, later: Later) -> int:
    done = cancelling.cancel_in(session, ids, CANCELLABLE_STATES)
    later.append(lambda: cancelling.announce(done, by=f"bulk:{action.id}"))
    return len(done)


def _publish(session: Session, ready: list[ReadyJob], later: Later, **fields: Any) -> int:
    sent = publish_ready(session, ready)  # a broker away: parked, the promoter sends them

    def announce() -> None:
        for job in sent:
            events.emit_job(job, "waiting", **fields)

    later.append(announce)
    return len(ready)


def _retry(session: Session, ids: list[str], action: BulkAction, later: Later) -> int:
    why = f"bulk retry {action.id}: {action.reason}"
    ready = store.retry(session, ids, action.id, action.actor, why)
    return _publish(session, ready, later, manualRetryBy=action.actor)


def _promote(session: Session, ids: list[str], action: BulkAction, later: Later) -> int:
    return _publish(session, upkeep_store.promote_now(session, ids), later)


def _clean(session: Session, ids: list[str], action: BulkAction, later: Later) -> int:
    return store.clean(session, ids)


def _obliterate(session: Session, ids: list[str], action: BulkAction, later: Later) -> int:
    return store.obliterate(session, ids)


ACTIONS: dict[str, Action] = {
    "retry": Action(
        (State.FAILED,),
        "finished_on",
        _retry,
        extra="NOT (opts ? 'deduplication') AND NOT (name = ANY(:ruled))",
        extra_params=lambda: {"ruled": manual_retry.declared()},
    ),
    "cancel": Action(CANCELLABLE_STATES, "created_at", _cancel),
    "promote": Action((State.DELAYED,), "created_at", _promote),
    "clean": Action(FINISHED_STATES, "finished_on", _clean),
    "drain": Action((State.WAITING, State.DELAYED), "created_at", _cancel, needs_queue=True),
    "obliterate": Action(
        tuple(s for s in State if s != State.ACTIVE),
        "created_at",
        _obliterate,
        needs_queue=True,
        system_only=True,
    ),
}


class BulkRefused(Refused):
    """A filter the action cannot take (a state it does not act on, a queue it needs)."""

    code = "validation_failed"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(
            message, details=[{"field": f"filter.{field}", "type": "bulk", "message": message}]
        )


@dataclass(frozen=True)
class Asked:
    """A bulk action as asked: ``action``, ``filter`` (its ``states`` all the action's, or
    those the caller named), by ``actor`` for ``reason``."""

    action: str
    filter: BulkFilter
    actor: str
    reason: str


def _checked(asked: Asked, system: bool) -> tuple[Action, BulkFilter]:
    action = ACTIONS.get(asked.action)
    if action is None:
        raise Refused(f"no such bulk action: {asked.action}")
    if action.system_only and not system:
        raise InvalidJobState(f"{asked.action} is for the system's scope: keel jobs bulk")
    if action.needs_queue and asked.filter.queue is None:
        raise BulkRefused("queue", f"{asked.action} needs a queue")
    states = asked.filter.states or action.states
    if not set(states) <= set(action.states):
        allowed = ", ".join(str(s) for s in action.states)
        raise BulkRefused("states", f"{asked.action} acts on jobs that are {allowed}")
    return action, replace(asked.filter, states=tuple(states))


def _where(action: Action, chosen: BulkFilter, started_at: Any) -> tuple[str, dict[str, Any]]:
    where, params = chosen.where(started_at, action.since)
    if not action.extra:
        return where, params
    more = action.extra_params() if action.extra_params is not None else {}
    return f"{where} AND {action.extra}", {**params, **more}


def preview(asked: Asked, *, system: bool = False) -> int:
    """How many jobs the action would touch if asked now."""
    action, chosen = _checked(asked, system)
    with transaction() as session:
        if asked.action == "obliterate":
            _check_obliterable(session, chosen.queue or "")
        now = session.execute(_NOW).scalar_one()
        return store.count(session, *_where(action, chosen, now))


def start(asked: Asked, *, system: bool = False) -> BulkAction:
    """Record the action (its audit) with how many jobs it matches; workers do the rest."""
    action, chosen = _checked(asked, system)
    with transaction() as session:
        if asked.action == "obliterate":
            _check_obliterable(session, chosen.queue or "")
        row = store.add(
            session,
            BulkAction(
                id=uuid.uuid4().hex,
                action=asked.action,
                tenant_id=chosen.tenant_id,
                filter=_stored(chosen),
                actor=asked.actor,
                reason=asked.reason,
                state="running",
                matched=0,
            ),
        )
        row.matched = store.count(session, *_where(action, chosen, row.created_at))
        if row.matched == 0:
            row.state = "done"
            row.finished_at = row.created_at
    log.info(
        "bulk %s %s asked by %s: %d jobs (%s)",
        row.action,
        row.id,
        row.actor,
        row.matched,
        row.filter,
        extra={"tenant_id": row.tenant_id},
    )
    return row


def _check_obliterable(session: Session, queue: str) -> None:
    paused = {(p.queue, p.tenant_id) for p in pauses_store.pauses(session)}
    if (queue, ALL_TENANTS) not in paused:
        raise JobConflict(f"pause the whole queue first: keel queues pause {queue}")
    if store.active_on(session, queue):
        raise JobConflict(f"jobs of {queue} are running: wait until none is active")


def work(bulk_id: str | None = None, *, batches: int = MAINTENANCE_BATCHES) -> int:
    """Work up to ``batches`` batches of a running action (``bulk_id``: that one) that no
    one else holds; how many batches it worked (0: none was free)."""
    worked = 0
    for _ in range(batches):
        later: Later = []
        held: str | None = None
        try:
            with transaction() as session:
                row = store.lock_running(session, bulk_id)
                if row is None:
                    break
                held = row.id
                action = ACTIONS[row.action]
                where, params = _where(action, _loaded(row.filter, row.tenant_id), row.created_at)
                ids = store.lock_batch(session, where, params, row.cursor, store.BATCH)
                done = action.apply(session, ids, row, later) if ids else 0
                store.advance(session, row, done, ids[-1] if ids else None, finished=not ids)
        except Exception as exc:
            if held is None:
                raise
            _note_failure(held, exc)
            break
        worked += 1
        for announce in later:
            announce()
        if not ids:
            log.info("bulk %s %s done", row.action, row.id)
    return worked


def _note_failure(bulk_id: str, exc: Exception) -> None:
    log.warning("bulk action %s: a batch failed; tried again later", bulk_id, exc_info=True)
    try:
        with transaction() as session:
            store.note_failure(session, bulk_id, f"{exc.__class__.__name__}: {exc}")
    except Exception:  # the database is away: the next tick tries the batch again anyway
        log.debug("could not note the failure of bulk action %s", bulk_id, exc_info=True)


def work_to_end(bulk_id: str, progress: Callable[[BulkAction], None]) -> BulkAction:
    """Work ``bulk_id`` until it is done, reporting each step forward (a worker may hold it
    for a batch meanwhile: it goes on there)."""
    seen = -1
    while True:
        if not work(bulk_id, batches=1):
            time.sleep(IDLE_WAIT_S)  # a worker holds it, or its batch failed: wait a little
        row = view(bulk_id, system=True)
        if row.done != seen or row.state == "done":
            progress(row)
            seen = row.done
        if row.state == "done":
            return row


def view(bulk_id: str, tenant_id: str | None = None, *, system: bool = False) -> BulkAction:
    """The action (its progress), if ``tenant_id``'s (``system``: anyone's)."""
    with transaction() as session:
        row = store.get(session, bulk_id)
        if row is None or (not system and row.tenant_id != tenant_id):
            raise JobNotFound("bulk action not found")
        session.expunge(row)
        return row


def describe(row: BulkAction) -> dict[str, Any]:
    return {
        "id": row.id,
        "action": row.action,
        "filter": row.filter,
        "tenantId": row.tenant_id,
        "actor": row.actor,
        "reason": row.reason,
        "state": row.state,
        "matched": row.matched,
        "done": row.done,
        "createdAt": iso(row.created_at),
        "finishedAt": iso(row.finished_at),
    }


def _stored(chosen: BulkFilter) -> dict[str, Any]:
    return {
        key: value
        for key, value in {
            "states": [str(s) for s in chosen.states],
            "queue": chosen.queue,
            "name": chosen.name,
            "createdAfter": _exact(chosen.created_after),
            "createdBefore": _exact(chosen.created_before),
            "finishedBefore": _exact(chosen.finished_before),
        }.items()
        if value is not None
    }


def _exact(moment: datetime | None) -> str | None:
    """To the microsecond, as counted: the workers apply the very bound it was asked with."""
    return moment.isoformat() if moment is not None else None


def _loaded(stored: dict[str, Any], tenant_id: str | None) -> BulkFilter:
    def when(key: str) -> datetime | None:
        value = stored.get(key)
        return datetime.fromisoformat(value) if value else None

    return BulkFilter(
        states=tuple(State(s) for s in stored["states"]),
        queue=stored.get("queue"),
        name=stored.get("name"),
        tenant_id=tenant_id,
        created_after=when("createdAfter"),
        created_before=when("createdBefore"),
        finished_before=when("finishedBefore"),
    )
