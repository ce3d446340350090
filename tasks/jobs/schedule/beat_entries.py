"""``beat_schedule`` entries as system job schedulers, brought in line whenever beat starts.

Celery's own scheduler keeps its entries in one process's memory, so two
beats fire every entry twice. Keel's beat (``tasks.jobs.schedule.beat``) stores each
entry of ``app.conf.beat_schedule`` as a system job scheduler with the id
``beat:<entry name>`` and fires it like any other: one fire per scheduled
time, whatever the number of beats. At every beat start the entries are
upserted (an unchanged entry keeps its next fire time) and ``beat:``
schedulers whose entry left the config are removed; that prefix is reserved.

- ``schedule``: seconds (a number), a ``timedelta`` or ``celery.schedules.schedule``
  become ``every``; a ``crontab`` becomes a 5-field cron ``pattern`` in its time
  zone (Celery's own field text where cron reads it the same way, else the
  values it stands for). ``solar`` and other schedule classes are refused.
- A task that is a Keel job (``KeelTask``): ``args``/``kwargs`` become the job's
  data (``task.data_for``); ``options`` may only repeat the task's own queue —
  a job's options are Keel's (``JobOptions``), not Celery's.
- Any other task is sent as a plain Celery message,
  ``app.send_task(name, args, kwargs, **options)``, from its scheduler row
  (``tasks.jobs.schedule.schedulers.CeleryMessage``): still once per scheduled time.
- ``options`` may also hold the scheduler's policies (``POLICY_OPTIONS``: ``overlap``,
  ``catchUp``, ``catchUpWindow``, ``jitter``, ``paused``), taken out of the message's
  options. A plain message leaves no record to watch, so its ``overlap`` is ``allow`` only.
  Without ``paused`` an entry stays as an operator left it (``keel schedulers pause``).

An entry that cannot be converted is logged as one error line naming it and
saying why, and gets no scheduler; the other entries are not affected.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab, schedule, solar
from croniter import croniter
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from tasks.jobs.model import registry
from tasks.jobs.model.errors import InvalidId, Refused, TemplateRefused
from tasks.jobs.model.schedule_rules import JobTemplate, Policy
from tasks.jobs.run.execute import KeelTask
from tasks.jobs.schedule import schedulers
from tasks.jobs.schedule.schedulers import CeleryMessage, SchedulerSpec, Scope, StoredSpec

log = logging.getLogger(__name__)
PREFIX = "beat:"
POLICY_OPTIONS = frozenset(Policy.model_fields)
ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative"})
# Celery's crontab attribute, the range of its values, in cron's field order.
CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day_of_month", 1, 31),
    ("month_of_year", 1, 12),
    ("day_of_week", 0, 6),  # 0 = Sunday, in Celery as in cron
)


class EntryRefused(Refused):
    """The beat_schedule entry cannot become a job scheduler."""

    code = "beat_entry_refused"


@dataclass(frozen=True)
class Conversion:
    """What one entry becomes: a scheduler (id, spec, queue); ``plain``: a Celery message."""

    scheduler_id: str
    spec: SchedulerSpec
    queue: str
    plain: bool


@dataclass
class Synced:
    """What a beat start did to the ``beat:`` schedulers."""

    upserted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def every_ms(value: float | timedelta | schedule) -> int:
    if isinstance(value, schedule):
        value = value.run_every
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return round(seconds * 1000)


def _cron_reads(text: str, index: int, low: int, high: int) -> set[int] | None:
    """The values cron takes ``text`` for in field ``index``; ``None`` if it cannot read it."""
    if not text or any(c.isspace() for c in text):
        return None
    parts = ["*"] * len(CRON_FIELDS)
    parts[index] = text
    try:
        expanded = croniter(" ".join(parts)).expanded[index]
        values = set(range(low, high + 1)) if expanded == ["*"] else {int(v) for v in expanded}
    except (ValueError, TypeError):  # croniter's errors are ValueErrors; "L" is no int
        return None
    return {v % 7 for v in values} if index == 4 else values  # cron's 7 is Sunday too


def _cron_field(entry: crontab, index: int) -> str:
    name, low, high = CRON_FIELDS[index]
    wanted = set(getattr(entry, name))
    original = getattr(entry, f"_orig_{name}", None)
    if isinstance(original, str | int) and _cron_reads(str(original), index, low, high) == wanted:
        return str(original)
    if wanted == set(range(low, high + 1)):
        return "*"
    return ",".join(str(v) for v in sorted(wanted))


def cron_pattern(entry: crontab) -> str:
    """The 5-field cron pattern that fires when Celery's ``crontab`` does."""
    fields = [_cron_field(entry, index) for index in range(len(CRON_FIELDS))]
    if fields[2] != "*" and fields[4] != "*":
        # Celery wants both the day of the month and the weekday to match; cron either one.
        raise EntryRefused(
            "a crontab that limits both day_of_month and day_of_week has no cron equivalent"
        )
    return " ".join(fields)


def _zone_name(entry: crontab) -> str:
    zone = entry.tz
    return str(getattr(zone, "key", None) or zone)


def rule_for(value: Any) -> dict[str, Any]:
    """The scheduler rule (``every`` or ``pattern`` + ``tz``) of a Celery schedule."""
    if isinstance(value, solar):
        raise EntryRefused("solar schedules are not supported: use a crontab or a period")
    if isinstance(value, crontab):
        return {"pattern": cron_pattern(value), "tz": _zone_name(value)}
    if isinstance(value, schedule | timedelta) or (
        isinstance(value, int | float) and not isinstance(value, bool)
    ):
        return {"every": every_ms(value)}
    raise EntryRefused(f"schedule {value!r} is not a number, timedelta, schedule or crontab")


def _json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        raise EntryRefused(f"{what} must be JSON: {value!r}") from None


def _keel_job(
    task: KeelTask, name: str, entry: Mapping[str, Any], rule: dict[str, Any]
) -> tuple[SchedulerSpec, str]:
    declared = registry.get(name)
    queue = str(declared.queue if declared else task.queue)
    options, policy = _policy_of(entry)
    for option, value in options.items():
        if option != "queue":
            raise EntryRefused(f"option {option!r} has no meaning for a Keel job")
        if value != queue:
            raise EntryRefused(f"{name} runs on queue {queue!r}, not {value!r}")
    try:
        data = task.data_for(entry.get("args") or (), entry.get("kwargs") or {})
    except TypeError as exc:
        raise EntryRefused(str(exc)) from None
    template = JobTemplate(name=name, data=_json(data, "the job data"))
    return SchedulerSpec(**rule, **policy, template=template), queue


def _policy_of(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The entry's options apart from its policies, and its policies."""
    options = dict(entry.get("options") or {})
    policy = {key: options.pop(key) for key in POLICY_OPTIONS & set(options)}
    return options, policy


def _plain(
    app: Celery, name: str, entry: Mapping[str, Any], rule: dict[str, Any]
) -> tuple[StoredSpec, str]:
    options, policy = _policy_of(entry)
    if policy.get("overlap", "allow") != "allow":
        raise EntryRefused("a task that is not a Keel job leaves no record: overlap is allow only")
    task = app.tasks.get(name)
    if registry.get(name) is not None:  # a job type whose task this app does not know as one
        raise EntryRefused(f"{name} is a Keel job type but not a KeelTask in this app")
    if task is None:  # as Celery's beat does; a worker that has it runs it
        log.warning("beat_schedule task %s is not registered in this beat: sent by name", name)
    queue = options.get("queue") or getattr(task, "queue", None) or app.conf.task_default_queue
    message = CeleryMessage(
        args=_json(list(entry.get("args") or ()), "args"),
        kwargs=_json(dict(entry.get("kwargs") or {}), "kwargs"),
        options=_json(options, "options"),
    )
    spec = StoredSpec(**rule, **policy, template=JobTemplate(name=name), celeryMessage=message)
    return spec, str(queue)


def convert(app: Celery, name: str, entry: Mapping[str, Any]) -> Conversion:
    """What the entry called ``name`` becomes, or ``EntryRefused`` saying why not."""
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise EntryRefused(f"unknown keys {sorted(unknown)}")
    if entry.get("relative"):
        raise EntryRefused("relative schedules are not supported")
    scheduler_id = PREFIX + name
    if len(scheduler_id) > 200:
        raise EntryRefused("the entry name is longer than 195 characters")
    task_name = entry.get("task")
    if not isinstance(task_name, str) or not task_name:
        raise EntryRefused("no task named")
    rule = rule_for(entry.get("schedule"))
    task = app.tasks.get(task_name)
    try:
        if isinstance(task, KeelTask):
            spec, queue = _keel_job(task, task_name, entry, rule)
            return Conversion(scheduler_id, spec, queue, plain=False)
        plain, queue = _plain(app, task_name, entry, rule)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(entry)"
        raise EntryRefused(f"{where}: {first['msg']}") from None
    return Conversion(scheduler_id, plain, queue, plain=True)


def _save(conversion: Conversion) -> None:
    if conversion.plain:
        assert isinstance(conversion.spec, StoredSpec)
        schedulers.upsert_plain(conversion.scheduler_id, conversion.spec, conversion.queue)
    else:
        scope = Scope(actor="beat_schedule")
        schedulers.upsert(scope, conversion.scheduler_id, conversion.spec, queue=conversion.queue)


def _upsert(app: Celery, name: str, entry: Mapping[str, Any]) -> None:
    conversion = convert(app, name, entry)
    try:
        _save(conversion)
    except IntegrityError:  # another beat inserted the same new scheduler at this moment
        _save(conversion)


def sync(app: Celery) -> Synced:
    """Upsert every entry of ``app.conf.beat_schedule``; remove ``beat:`` schedulers of no entry.

    A refused entry is logged and gets no scheduler; a database error stops
    the sync (beat tries again), so a refused entry is never confused with an
    unreachable database.
    """
    synced = Synced()
    for name, entry in (app.conf.beat_schedule or {}).items():
        try:
            if not isinstance(entry, Mapping):
                raise EntryRefused("the entry is not a dict")
            _upsert(app, str(name), entry)
        except (EntryRefused, TemplateRefused, InvalidId) as refused:  # a name with a line break
            log.error("beat_schedule entry %r is not scheduled: %s", name, refused)
            synced.refused.append(str(name))
            continue
        synced.upserted.append(PREFIX + str(name))
    synced.removed = schedulers.remove_system_except(PREFIX, set(synced.upserted))
    log.info(
        "beat_schedule: %d entries scheduled, %d refused, %d removed (%s)",
        len(synced.upserted),
        len(synced.refused),
        len(synced.removed),
        ", ".join(synced.removed) or "none",
    )
    return synced
