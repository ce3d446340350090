"""How a Celery call's options map to a job's: ``countdown``/``eta`` → ``delay``,
``expires`` → ``expiresAt``, ``task_id`` → the job id, Keel's ``job_options``; and
the canvas options kept on the record (see ``tasks.jobs.calls.celery_task``)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from tasks.jobs.intake import tenancy
from tasks.jobs.intake.messages import CONCURRENCY_KEY
from tasks.jobs.model.key_limits import key_text
from tasks.jobs.model.options import JobOptions, timeout_cap_ms
from tasks.jobs.model.owner import Owner


class HasDefaultOptions(Protocol):
    """A Keel task: its own options for a job's data and owner."""

    def default_options(self, data: dict[str, Any], owner: Owner | None) -> JobOptions: ...


# Canvas options kept on the record (Celery's option name → the context's key).
CANVAS_OPTIONS = {
    "chord": "chord",
    "group_id": "group",
    "group_index": "group_index",
    "chain": "chain",
    "parent_id": "parent_id",
    "root_id": "root_id",
}


def _moment(value: Any, now: datetime) -> datetime:
    """A Celery ``eta``/``expires`` value (datetime, ISO text, or seconds from now)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        return _moment(datetime.fromisoformat(value), now)
    if isinstance(value, timedelta):
        return now + value
    return now + timedelta(seconds=float(value))


def delay_ms(options: dict[str, Any], now: datetime) -> int:
    """Milliseconds until the job may run, from ``countdown`` or ``eta``."""
    if options.get("countdown") is not None:
        return max(0, math.ceil(float(options["countdown"]) * 1000))
    if options.get("eta") is not None:
        due = _moment(options["eta"], now)
        return max(0, math.ceil((due - now).total_seconds() * 1000))
    return 0


def job_options(
    task: HasDefaultOptions, data: dict[str, Any], owner: Owner | None, options: dict[str, Any]
) -> JobOptions:
    """The task's own options for this data, then what the call gives, then its delay."""
    base = task.default_options(data, owner).stored()
    given = options.get("job_options")
    if isinstance(given, JobOptions):
        base.update(given.stored())
    elif isinstance(given, dict):
        base.update(JobOptions.model_validate(given).stored())
    task_id = options.get("task_id")
    if task_id:
        base["jobId"] = str(task_id)
    now = datetime.now(UTC)
    wait = delay_ms(options, now)
    if wait:
        base["delay"] = wait
    if options.get("expires") is not None:
        base["expiresAt"] = _moment(options["expires"], now).isoformat()
    return JobOptions.model_validate(base)


def call_priority(task: Any, options: dict[str, Any]) -> Any:
    """A call's ``priority``, as Celery picks it: the call's, else the task's, else the app's
    ``task_default_priority`` (``None``: none given; ``tenancy.rank`` places it)."""
    for given in (options.get("priority"), task.priority, task.app.conf.task_default_priority):
        if given is not None:
            return given
    return None


#: What a chord body or a chain's step does when the part or step before it ends without a
#: result (its ``on_child_failure`` option; ``tasks.jobs.end.chord_parts``,
#: ``tasks.jobs.end.ending``).
FAILURE_POLICIES = ("fail", "ignore", "remove")


def failure_policy(options: dict[str, Any]) -> str:
    """A signature's ``on_child_failure`` option (``fail`` if unset); anything but a policy is
    refused (``ValueError``)."""
    policy = options.get("on_child_failure") or "fail"
    if policy not in FAILURE_POLICIES:
        choices = ", ".join(FAILURE_POLICIES)
        raise ValueError(f"on_child_failure must be one of {choices}, not {policy!r}")
    return str(policy)


def _check_steps(options: dict[str, Any]) -> None:
    """Refuse, at the call, a priority that could not be ranked, a time limit that is no
    positive number or an unknown failure policy: the call's own, and those of the chain
    steps and links it carries
    (recorded only when their parent ends, they would otherwise fail the parent after it
    ran). ``ValueError`` naming the value."""
    signatures = [*(options.get("chain") or ())]
    for option in ("link", "link_error"):
        linked = options.get(option)
        signatures.extend(
            linked if isinstance(linked, list | tuple) else [linked] if linked else []
        )
    tenancy.rank(options.get("priority"))
    for sig in signatures:
        if isinstance(sig, dict):
            tenancy.rank((sig.get("options") or {}).get("priority"))
            time_limits(sig.get("options") or {})
            failure_policy(sig.get("options") or {})


def time_limits(options: dict[str, Any]) -> list[float | None] | None:
    """A call's ``time_limit`` and ``soft_time_limit``, as Celery's ``timelimit`` header
    carries them (``[hard, soft]``), or ``None`` when the call gives neither (the worker then
    applies the task's own, or ``task_time_limit``/``task_soft_time_limit``). Anything but a
    positive number of seconds is refused by the call (``ValueError``), and so is a limit past
    ``KEEL_MAX_JOB_TIMEOUT_S``, as a ``timeout`` past it is (``capped_timeout``)."""
    limits: list[float | None] = []
    for option in ("time_limit", "soft_time_limit"):
        value = options.get(option)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 < value < math.inf
        ):
            raise ValueError(f"{option} must be a positive number of seconds, not {value!r}")
        if value is not None and value * 1000 > timeout_cap_ms():
            cap_s = timeout_cap_ms() // 1000
            raise ValueError(
                f"{option} must be at most {cap_s} s (KEEL_MAX_JOB_TIMEOUT_S={cap_s}): a longer"
                " run would outlast the workers' shutdown grace"
            )
        limits.append(value)
    return limits if any(limit is not None for limit in limits) else None


def with_options(ctx: dict[str, Any] | None, opts: JobOptions) -> dict[str, Any] | None:
    """``ctx`` with what every message of the job carries of its options: its ``timeout`` as
    its hard time limit, unless the call gave one (``time_limit=``), and its
    ``concurrencyKey``."""
    if opts.concurrency_key is not None:
        ctx = {**(ctx or {}), CONCURRENCY_KEY: key_text(opts.concurrency_key)}
    if opts.timeout is None:
        return ctx
    hard, soft = (ctx or {}).get("timelimit") or (None, None)
    if hard is not None:
        return ctx
    return {**(ctx or {}), "timelimit": [opts.timeout / 1000, soft]}


def canvas_context(options: dict[str, Any]) -> dict[str, Any]:
    """The canvas options of a call, as the record keeps them (signatures as plain dicts)."""
    ctx: dict[str, Any] = {}
    for option, key in CANVAS_OPTIONS.items():
        if options.get(option) is not None:
            ctx[key] = options[option]
    for option in ("link", "link_error"):
        linked = options.get(option)
        if linked:
            ctx[option] = list(linked) if isinstance(linked, list | tuple) else [linked]
    headers = call_headers(options.get("headers"))
    if headers:
        ctx["headers"] = headers
    if options.get("priority") is not None:  # ranked when the job is recorded
        ctx["priority"] = options["priority"]
    limits = time_limits(options)
    if limits is not None:
        ctx["timelimit"] = limits
    _check_steps(options)
    plain: dict[str, Any] = _plain(ctx)
    return plain


# Headers of Celery's task message that a call's ``headers=`` never replaces.
PROTOCOL_HEADERS = frozenset(
    {
        "lang",
        "task",
        "id",
        "shadow",
        "eta",
        "expires",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
        "keel",
        "keel_tenant",
        "keel_key",
    }
)


def call_headers(given: Any) -> dict[str, Any]:
    """A call's ``headers=`` (correlation ids and the like), as the record keeps them and its
    messages carry them: names are text, values JSON; Celery's own headers are not theirs."""
    if not given:
        return {}
    if not isinstance(given, dict):
        raise TypeError(f"headers must be a dict, not {type(given).__name__}")
    headers: dict[str, Any] = {}
    for name, value in given.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"a header's name must be non-empty text, not {name!r}")
        if name in PROTOCOL_HEADERS:
            raise ValueError(f"header {name!r} is Celery's own: choose another name")
        headers[name] = value
    return headers


def _plain(value: Any) -> Any:
    """Signatures are dicts; make them (and their nested parts) JSON-ready plain values.

    A step's ``eta``/``expires`` may be a datetime: kept as ISO text, which ``_moment``
    reads back when the step is recorded.
    """
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
