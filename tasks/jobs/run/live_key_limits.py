"""A job type's key limits overridden live: per tenant or key pattern, stored in Postgres,
audited, in force on every worker within ``REFRESH_S`` plus a claim, without a restart.

A job type declares its key limits (``KeyConcurrency``, ``KeyRate``:
``tasks.jobs.model.key_limits``). An override (``set_override``: the API's
``PUT /api/v1/system/key-limits/<job_name>``, ``keel limits keys set``) replaces the
``max_running`` and/or the rate of the keys it matches: one tenant's or any tenant's, one
key or a pattern (``partner-*``); which override a key takes is
``tasks.jobs.model.key_overrides``'s. ``clear_override`` deletes one: the declaration (or a
less specific override) holds again. Every change is a row of the append-only
``key_limit_changes``, written in the change's transaction.

Each worker process keeps the overrides it read and reads them again when they are
``REFRESH_S`` old, before the next keyed delivery it admits (``tasks.jobs.run.key_limits``),
as the queue limits set live (``live_limits``): one read of a tiny table per process and
second while keyed jobs arrive, none per job. Lowering a ``max_running`` stops nothing that
runs: the key's new takes are refused while its holders reach the new limit. A job already
in its key's line when a limit is raised or lifted is woken when one of the key's runs
ends, or asks again on its own within the line's hold. If Postgres cannot be read, a
process keeps the overrides it read last and tries again ``REFRESH_S`` later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
from tasks.jobs.model.key_overrides import (
    ANY_TENANT,
    KeyOverride,
    OverrideRefused,
    checked,
    concurrency_of,
    deciding,
    ordered,
    pattern_problem,
    rate_of,
)
from tasks.jobs.observe.queries import iso
from tasks.jobs.run.live_limits import REFRESH_S
from tasks.jobs.store import key_limits as store
from tasks.jobs.store.key_limits import KeyLimitChange, KeyLimitRow
from tasks.platform.celery_app import app
from tasks.platform.db import transaction
from tasks.platform.refreshed import Refreshed

log = logging.getLogger(__name__)

__all__ = [
    "ANY_TENANT",
    "REFRESH_S",
    "JobKeyLimits",
    "KeyLimitChange",
    "OverrideRefused",
    "UnknownJobType",
    "change_json",
    "clear_override",
    "concurrency",
    "declared_of",
    "history",
    "in_force",
    "of",
    "pattern_problem",
    "rate",
    "set_override",
    "shown",
    "to_json",
]


class UnknownJobType(LookupError):
    """No job type of that name declares a key limit (``key_concurrency`` or ``key_rate``)."""

    def __init__(self, job_name: str) -> None:
        super().__init__(
            f"no job type called {job_name!r} declares a key limit (key_concurrency or key_rate)"
        )


def _as_override(row: KeyLimitRow) -> KeyOverride:
    return KeyOverride(row.job_name, row.tenant, row.key, row.limits)


def _read_overrides() -> dict[str, list[KeyOverride]]:
    """The overrides by job type, most specific first."""
    with transaction() as session:
        found = store.overrides(session)
    by_name: dict[str, list[KeyOverride]] = {}
    for row in found:
        by_name.setdefault(row.job_name, []).append(_as_override(row))
    return {name: ordered(rules) for name, rules in by_name.items()}


_OVERRIDES: Refreshed[dict[str, list[KeyOverride]]] = Refreshed(
    _read_overrides, {}, REFRESH_S, "the key limit overrides"
)


def concurrency(
    job_name: str, tenant: str | None, key: str, declared: KeyConcurrency
) -> KeyConcurrency | None:
    """The concurrency in force for ``tenant``'s jobs of ``key`` (``None``: none), as this
    process knows the overrides (at most ``REFRESH_S`` old)."""
    rules = _OVERRIDES.get().get(job_name, [])
    if not rules:
        return declared
    return concurrency_of(declared, deciding(rules, tenant, key, "max_running"))


def rate(job_name: str, tenant: str | None, key: str, declared: KeyRate) -> KeyRate | None:
    """The start rate in force for ``tenant``'s jobs of ``key`` (``None``: none)."""
    rules = _OVERRIDES.get().get(job_name, [])
    if not rules:
        return declared
    return rate_of(declared, deciding(rules, tenant, key, "rate"))


def declared_of(job_name: str) -> tuple[KeyConcurrency | None, KeyRate | None]:
    """The key limits the job type ``job_name`` declares, as this process loaded it."""
    task = app.tasks.get(job_name)
    return getattr(task, "key_concurrency", None), getattr(task, "key_rate", None)


def _declaring() -> list[str]:
    return sorted(name for name in list(app.tasks) if any(declared_of(name)))


@dataclass(frozen=True)
class JobKeyLimits:
    """One job type's key limits: declared, and the overrides of them, most specific first."""

    job_name: str
    concurrency: KeyConcurrency | None
    rate: KeyRate | None
    overrides: list[KeyLimitRow]


def shown(job_name: str | None = None) -> list[JobKeyLimits]:
    """Every job type that declares key limits or has overrides (or ``job_name``'s), read now."""
    with transaction() as session:
        rows = store.overrides(session, job_name)
    if job_name is None:
        declaring = set(_declaring())
    else:
        declaring = {job_name} if any(declared_of(job_name)) else set()
    names = {row.job_name for row in rows} | declaring
    found = []
    for name in sorted(names):
        mine = {(r.tenant, r.key): r for r in rows if r.job_name == name}
        first = [mine[(o.tenant, o.key)] for o in ordered(_as_override(r) for r in mine.values())]
        found.append(JobKeyLimits(name, *declared_of(name), first))
    return found


def of(job_name: str) -> JobKeyLimits:
    """``job_name``'s key limits; ``UnknownJobType`` if it neither declares any nor has an
    override."""
    found = shown(job_name)
    if not found:
        raise UnknownJobType(job_name)
    return found[0]


def in_force(limits: JobKeyLimits, tenant: str | None, key: str) -> dict[str, Any]:
    """What holds for ``tenant``'s jobs of ``key``, read now, and which override decides each."""
    rules = ordered(_as_override(row) for row in limits.overrides)
    running = deciding(rules, tenant, key, "max_running")
    starts = deciding(rules, tenant, key, "rate")
    held = concurrency_of(limits.concurrency, running) if limits.concurrency else None
    window = rate_of(limits.rate, starts) if limits.rate else None
    return {
        "tenant": tenant,
        "key": key,
        "maxRunning": held.max_running if held else None,
        "rate": _rate_json(window),
        "maxRunningFrom": _origin(running, limits.concurrency),
        "rateFrom": _origin(starts, limits.rate),
    }


def _origin(override: KeyOverride | None, declared: object) -> dict[str, str] | str | None:
    if override is not None:
        return {"tenant": override.tenant, "key": override.key}
    return "declared" if declared is not None else None


def _rate_json(rate: KeyRate | None) -> dict[str, int] | None:
    return None if rate is None else {"max": rate.max, "durationMs": rate.per_ms}


def limits_json(limits: dict[str, Any] | None) -> dict[str, Any] | None:
    """An override's fields as the API and the CLI show them (``maxRunning``, ``durationMs``);
    the fields given only."""
    if limits is None:
        return None
    shown: dict[str, Any] = {}
    if "max_running" in limits:
        shown["maxRunning"] = limits["max_running"]
    if "rate" in limits:
        rate = limits["rate"]
        shown["rate"] = None if rate is None else {"max": rate["max"], "durationMs": rate["per_ms"]}
    return shown


def to_json(limits: JobKeyLimits) -> dict[str, Any]:
    """One job type's key limits as the API and ``keel limits keys`` show them."""
    concurrency = limits.concurrency
    declared = {
        "key": _source(concurrency.key) if concurrency else None,
        "maxRunning": concurrency.max_running if concurrency else None,
        "strategy": concurrency.strategy if concurrency else None,
        "rateKey": _source(limits.rate.key) if limits.rate else None,
        "rate": _rate_json(limits.rate),
    }
    return {
        "name": limits.job_name,
        "declared": declared if concurrency or limits.rate else None,
        "overrides": [
            {
                "tenant": row.tenant,
                "key": row.key,
                **(limits_json(row.limits) or {}),
                "setBy": row.set_by,
                "setAt": iso(row.set_at),
                "reason": row.reason,
            }
            for row in limits.overrides
        ],
    }


def _source(source: object) -> str:
    return source if isinstance(source, str) else "(a function of the data)"


def change_json(change: KeyLimitChange) -> dict[str, Any]:
    """One audited change as the API and ``keel limits keys show`` show it."""
    return {
        "id": change.id,
        "name": change.job_name,
        "tenant": change.tenant,
        "key": change.key,
        "actor": change.actor,
        "reason": change.reason,
        "before": limits_json(change.before),
        "after": limits_json(change.after),
        "recordedAt": iso(change.recorded_at),
    }


def set_override(
    job_name: str, tenant: str, key: str, given: dict[str, Any], by: str, reason: str
) -> KeyLimitChange:
    """Override ``job_name``'s key limits for ``tenant``'s (``*``: any) keys ``key``, with
    ``given`` (``key_overrides.checked``'s shape), audited; every worker takes it within
    ``REFRESH_S``. ``UnknownJobType``; ``OverrideRefused`` naming the field."""
    declared = declared_of(job_name)
    if not any(declared):
        raise UnknownJobType(job_name)
    override = checked(given, *declared)
    with transaction() as session:
        change = store.put(session, job_name, tenant, key, override, by, reason)
    _OVERRIDES.forget()
    log.info(
        "key limits of %s (tenant %s, key %s) overridden by %s: %s",
        job_name,
        tenant,
        key,
        by,
        override,
        extra={"job_name": job_name},
    )
    return change


def clear_override(
    job_name: str, tenant: str, key: str, by: str, reason: str
) -> KeyLimitChange | None:
    """Delete an override (the declaration holds again), audited; ``None``: there was none."""
    with transaction() as session:
        change = store.clear(session, job_name, tenant, key, by, reason)
    _OVERRIDES.forget()
    if change is not None:
        log.info(
            "key limit override of %s (tenant %s, key %s) cleared by %s",
            job_name,
            tenant,
            key,
            by,
            extra={"job_name": job_name},
        )
    return change


def history(job_name: str | None = None, limit: int = 50) -> list[KeyLimitChange]:
    """The newest changes (of ``job_name``), newest first."""
    with transaction() as session:
        return store.changes(session, job_name, limit)
