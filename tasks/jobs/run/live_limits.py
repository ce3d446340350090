"""Queue limits changed live: stored in Postgres, audited, in force on every worker within
``REFRESH_S`` plus a claim, without a restart.

``KEEL_QUEUE_LIMITS`` stays each queue's default. An override (``set_limits``: the API's
``PUT /api/v1/system/queues/<queue>/limits``, ``keel queues limits set``) replaces the
fields it gives: ``concurrency``, ``rate``, either set to ``None`` meaning unlimited; a field
it leaves out keeps its default. ``clear_limits`` deletes the override: the default is in
force again. Every change is a row of the append-only ``queue_limit_changes`` (who, why,
the override before and after), written in the change's transaction.

Each worker process keeps the overrides it read and reads them again when they are
``REFRESH_S`` old, before the next delivery it admits (``tasks.jobs.run.limits``): one read
of a tiny table per process and second while jobs arrive. A change is thus taken by every
worker's next admission once its copy is older than ``REFRESH_S``: within ``REFRESH_S``
(1 s) of the commit. Lowering a concurrency stops nothing that runs (as BullMQ's): new
takes are refused while the queue's holders reach the new limit, so at most the new limit
runs once the runs that held slots before the change have ended. If Postgres cannot be
read, a process keeps the limits it read last (and the defaults before any read) and tries
again ``REFRESH_S`` later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tasks.jobs.observe.queries import iso
from tasks.jobs.store import queue_limits as store
from tasks.jobs.store.queue_limits import Change, Override
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.platform.refreshed import Refreshed
from tasks.platform.setting_types import QueueLimit, Rate

log = logging.getLogger(__name__)

REFRESH_S = 1.0
FIELDS = ("concurrency", "rate")

__all__ = [
    "REFRESH_S",
    "Change",
    "Override",
    "QueueLimits",
    "change_json",
    "clear_limits",
    "described",
    "effective",
    "history",
    "merged",
    "of",
    "set_limits",
    "shown",
    "stored",
    "to_json",
]


def merged(default: QueueLimit | None, override: dict[str, Any] | None) -> QueueLimit | None:
    """The limits in force: ``default`` with the fields ``override`` gives replaced (``None``:
    unlimited when no field limits anything)."""
    if override is None:
        return default
    fields: dict[str, Any] = default.model_dump() if default is not None else {}
    fields.update({name: override[name] for name in FIELDS if name in override})
    limit = QueueLimit.model_validate(fields)
    return limit if limit.concurrency or limit.rate else None


def stored(concurrency: int | None, rate: Rate | None, given: set[str]) -> dict[str, Any]:
    """The override kept for the fields ``given`` (a ``None`` value: unlimited)."""
    values = {"concurrency": concurrency, "rate": rate.model_dump() if rate else None}
    unknown = given - set(FIELDS)
    if unknown or not given:
        raise ValueError(f"give concurrency or rate (not {sorted(unknown)})")
    QueueLimit.model_validate({name: values[name] for name in given})  # >= 1, as the setting
    return {name: values[name] for name in FIELDS if name in given}


def _read_overrides() -> dict[str, dict[str, Any]]:
    with transaction() as session:
        return {o.queue: o.limits for o in store.overrides(session)}


_OVERRIDES: Refreshed[dict[str, dict[str, Any]]] = Refreshed(
    _read_overrides, {}, REFRESH_S, "the queue limits set live"
)


def effective(queue: str) -> QueueLimit | None:
    """``queue``'s limits in force now, as this process knows them (at most ``REFRESH_S``
    old): what a worker admits a delivery by."""
    return merged(get_settings().queue_limits.get(queue), _OVERRIDES.get().get(queue))


@dataclass(frozen=True)
class QueueLimits:
    """One queue's limits: in force, its default (``KEEL_QUEUE_LIMITS``), the override."""

    queue: str
    effective: QueueLimit | None
    default: QueueLimit | None
    override: Override | None

    @property
    def source(self) -> str:
        """Where the limits in force come from: ``live``, ``KEEL_QUEUE_LIMITS`` or ``none``."""
        return "live" if self.override else ("KEEL_QUEUE_LIMITS" if self.default else "none")


def shown() -> list[QueueLimits]:
    """Every queue with a default or an override, read now (not this process's copy)."""
    defaults = get_settings().queue_limits
    with transaction() as session:
        found = {o.queue: o for o in store.overrides(session)}
    return [
        QueueLimits(
            queue,
            merged(defaults.get(queue), found[queue].limits if queue in found else None),
            defaults.get(queue),
            found.get(queue),
        )
        for queue in sorted(set(defaults) | set(found))
    ]


def of(queue: str) -> QueueLimits:
    """One queue's limits, read now (none: a queue with neither default nor override)."""
    found = {limits.queue: limits for limits in shown()}
    return found.get(queue, QueueLimits(queue, None, None, None))


def described(limit: QueueLimit | dict[str, Any] | None) -> dict[str, Any] | None:
    """Limits as the API and the CLI show them (``durationMs``); an override's fields given
    only."""
    if limit is None:
        return None
    fields = limit.model_dump() if isinstance(limit, QueueLimit) else limit
    rate = fields.get("rate")
    shown: dict[str, Any] = {name: fields[name] for name in ("concurrency",) if name in fields}
    if "rate" in fields:
        shown["rate"] = {"max": rate["max"], "durationMs": rate["duration_ms"]} if rate else None
    return shown


def to_json(limits: QueueLimits) -> dict[str, Any]:
    """One queue's limits as the API and ``keel queues limits`` show them."""
    override = limits.override
    return {
        "queue": limits.queue,
        "effective": described(limits.effective),
        "default": described(limits.default),
        "override": None
        if override is None
        else {
            **(described(override.limits) or {}),
            "setBy": override.set_by,
            "setAt": iso(override.set_at),
            "reason": override.reason,
        },
        "source": limits.source,
    }


def change_json(change: Change) -> dict[str, Any]:
    """One audited change as the API and ``keel queues limits show`` show it."""
    return {
        "id": change.id,
        "actor": change.actor,
        "reason": change.reason,
        "before": described(change.before),
        "after": described(change.after),
        "recordedAt": iso(change.recorded_at),
    }


def set_limits(queue: str, override: dict[str, Any], by: str, reason: str) -> Change:
    """Set ``queue``'s override (``stored``'s shape), audited; every worker takes it within
    ``REFRESH_S``."""
    with transaction() as session:
        change = store.put(session, queue, override, by, reason)
    _OVERRIDES.forget()
    log.info("queue %s limits set live by %s: %s", queue, by, override, extra={"queue": queue})
    return change


def clear_limits(queue: str, by: str, reason: str) -> Change | None:
    """Delete ``queue``'s override (its default is in force again), audited; ``None``: there
    was none."""
    with transaction() as session:
        change = store.clear(session, queue, by, reason)
    _OVERRIDES.forget()
    if change is not None:
        log.info("queue %s limits set live cleared by %s", queue, by, extra={"queue": queue})
    return change


def history(queue: str | None = None, limit: int = 50) -> list[Change]:
    """The newest changes (of ``queue``), newest first."""
    with transaction() as session:
        return store.changes(session, queue, limit)
