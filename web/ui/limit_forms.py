"""The platform role's forms that change the limits every tenant shares: a queue's limits
(concurrency, rate) and a job type's key limit overrides (maxRunning, rate; for one tenant's
keys or any tenant's, one key or a pattern), each set or cleared with a reason.

A form is turned into the body of its API twin (``PUT /api/v1/system/queues/<queue>/limits``,
``PUT /api/v1/system/key-limits/<name>`` and their ``DELETE``), validated by the same models
and saved by the same functions (``web.queue_limits.put_limits``,
``web.key_limits.put_override``, ``live_limits.clear_limits``,
``live_key_limits.clear_override``): the change is stored, taken by every worker within
about a second and audited exactly as the API's and the CLI's, its actor ``ui:<user>`` (the
API's is ``api:metrics-token``, the CLI's ``cli:<login>``) and its reason required.

A refusal (a field the model refuses, an unknown job type, a missing reason) shows the page
again, 400, with the API's message, each field's reason next to it and the values as typed;
nothing is stored. A change done is a flash on the page it came from (POST-redirect-GET).
Only a platform session sends them (``reach="acts"``, ``web.ui.platform``): a tenant's
session, an operator's included, is 403 and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

from flask import flash, g, redirect, request, url_for
from werkzeug.datastructures import MultiDict

from tasks.jobs.model.errors import KeelError
from tasks.jobs.run import live_key_limits, live_limits
from web import key_limits, queue_limits
from web.api import check_payload, validate
from web.auth import OPERATOR
from web.errors import ApiError, status_of
from web.ui import bp
from web.ui.forms import explained
from web.ui.key_limits import key_limits_shown
from web.ui.queues import platform_queues
from web.ui.session import signed_in

NO_LIMIT = "none"  # typed into a limit's field: that limit lifted
WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")  # ASCII digits only (not "²", not "١٢")
RATE_FIELDS = ("rate.max", "rate.durationMs")


def actor() -> str:
    """Who a change is audited as: the platform user, marked as the dashboard's."""
    return f"ui:{g.principal.user_id}"


def _number(raw: str) -> Any:
    """A limit as typed: a whole number, ``None`` for "none", else the text as typed (for the
    API's model to refuse by its field's name)."""
    text = raw.strip()
    if text.lower() == NO_LIMIT:
        return None
    return int(text) if WHOLE_NUMBER.fullmatch(text) else text


def _limits(form: MultiDict, running: str) -> dict[str, Any]:
    """The limit fields of an API body: ``running`` (a count) and ``rate``; a field left
    blank is left out, as in the API."""
    body: dict[str, Any] = {}
    if form.get(running, "").strip():
        body[running] = _number(form[running])
    most, per = (form.get(name, "").strip() for name in RATE_FIELDS)
    if most.lower() == NO_LIMIT and not per:
        body["rate"] = None
    elif most or per:
        rate = {"max": _number(most)} if most else {}
        body["rate"] = {**rate, "durationMs": _number(per)} if per else rate
    return body


def _named(form: MultiDict, field: str, pattern: str, what: str) -> str:
    """A form's ``field`` naming a queue or a job type, as its API twin's path takes it."""
    value = form.get(field, "")
    if not re.fullmatch(pattern, value):
        raise ApiError(
            400,
            f"{field}: {what}",
            code="validation_failed",
            details=[{"field": field, "type": "value_error", "message": what}],
        )
    return value


def _refusal(kind: str, show: Callable[..., Any], refused: KeelError) -> Any:
    """The page again with the form as typed, the API's message and each field's reason."""
    status = status_of(refused)
    if status >= 500:
        raise refused
    errors: dict[str, str] = {}
    for detail in refused.details:
        if isinstance(detail, dict) and "field" in detail and "message" in detail:
            errors.setdefault(str(detail["field"]), str(detail["message"]))
    return show(status, form=request.form, form_kind=kind, errors=errors, error=explained(refused))


def _shown_limits(fields: dict[str, Any] | None, running: str) -> str:
    """Limits as a person reads them: "1 at once · 5 starts per 1000 ms"."""
    if not fields or not (fields.get(running) or fields.get("rate")):
        return "no limit"
    said = [f"{fields[running]} at once"] if fields.get(running) else []
    rate = fields.get("rate")
    said += [f"{rate['max']} starts per {rate['durationMs']} ms"] if rate else []
    return " · ".join(said)


def _unknown_job_type(exc: live_key_limits.UnknownJobType) -> ApiError:
    return ApiError(
        400,
        str(exc),
        code="job_type_not_found",
        details=[{"field": "name", "type": "value_error", "message": str(exc)}],
    )


@bp.post("/queue-limits")
@signed_in(OPERATOR, reach="acts")
def set_queue_limits() -> Any:
    form, queue = request.form, ""
    try:
        queue = _named(form, "queue", queue_limits.QUEUE["queue"], "a queue's name")
        body = {**_limits(form, "concurrency"), "reason": form.get("reason", "").strip()}
        limits = validate(queue_limits.SetQueueLimits, check_payload(body))
        assert isinstance(limits, queue_limits.SetQueueLimits)
        queue_limits.put_limits(queue, limits, actor())
    except KeelError as refused:  # the queue's card shows the form again, whatever it holds
        return _refusal("set", partial(platform_queues, also=queue), refused)
    effective = live_limits.to_json(live_limits.of(queue))["effective"]
    in_force = _shown_limits(effective, "concurrency")
    flash(f"Queue {queue}: {in_force} in force on every worker within a second.", "ok")
    return redirect(url_for("ui.queues_page"), 303)


@bp.post("/queue-limits/clear")
@signed_in(OPERATOR, reach="acts")
def clear_queue_limits() -> Any:
    form, queue = request.form, ""
    try:
        queue = _named(form, "queue", queue_limits.QUEUE["queue"], "a queue's name")
        body = check_payload({"reason": form.get("reason", "").strip()})
        cleared = validate(queue_limits.ClearQuery, body)
        assert isinstance(cleared, queue_limits.ClearQuery)
    except KeelError as refused:
        return _refusal("clear", partial(platform_queues, also=queue), refused)
    if live_limits.clear_limits(queue, actor(), cleared.reason) is None:
        flash(f"Queue {queue} had no limits set live: nothing cleared.", "error")
    else:
        default = _shown_limits(
            live_limits.to_json(live_limits.of(queue))["effective"], "concurrency"
        )
        flash(f"Queue {queue}: limits set live cleared; its default ({default}) is in force.", "ok")
    return redirect(url_for("ui.queues_page"), 303)


def _tenant_and_key(form: MultiDict) -> dict[str, str]:
    """The override's tenant (blank: any tenant's) and key, as the API's body names them."""
    tenant = form.get("tenant", "").strip()
    return {"key": form.get("key", "").strip(), **({"tenant": tenant} if tenant else {})}


@bp.post("/key-limits")
@signed_in(OPERATOR, reach="acts")
def set_key_limit() -> Any:
    form = request.form
    try:
        name = _named(form, "name", key_limits.JOB_NAME["job_name"], "a job type's name")
        body = {
            **_tenant_and_key(form),
            **_limits(form, "maxRunning"),
            "reason": form.get("reason", "").strip(),
        }
        override = validate(key_limits.SetKeyLimit, check_payload(body))
        assert isinstance(override, key_limits.SetKeyLimit)
        try:
            key_limits.put_override(name, override, actor())
        except live_key_limits.UnknownJobType as exc:
            raise _unknown_job_type(exc) from None
    except KeelError as refused:
        return _refusal("set", key_limits_shown, refused)
    given = {"maxRunning": override.maxRunning, "rate": _rate_of(override)}
    whose = "any tenant" if override.tenant == live_key_limits.ANY_TENANT else override.tenant
    said = _shown_limits({k: v for k, v in given.items() if k in body}, "maxRunning")
    flash(f"{name}, {whose}, key {override.key}: {said}, in force within a second.", "ok")
    return redirect(url_for("ui.key_limits_page"), 303)


def _rate_of(override: key_limits.SetKeyLimit) -> dict[str, int] | None:
    rate = override.rate
    return None if rate is None else {"max": rate.max, "durationMs": rate.durationMs}


@bp.post("/key-limits/clear")
@signed_in(OPERATOR, reach="acts")
def clear_key_limit() -> Any:
    form = request.form
    try:
        name = _named(form, "name", key_limits.JOB_NAME["job_name"], "a job type's name")
        body = {**_tenant_and_key(form), "reason": form.get("reason", "").strip()}
        cleared = validate(key_limits.ClearQuery, check_payload(body))
        assert isinstance(cleared, key_limits.ClearQuery)
    except KeelError as refused:
        return _refusal("clear", key_limits_shown, refused)
    whose = "any tenant" if cleared.tenant == live_key_limits.ANY_TENANT else cleared.tenant
    change = live_key_limits.clear_override(
        name, cleared.tenant, cleared.key, actor(), cleared.reason
    )
    if change is None:
        flash(f"{name} had no override for {whose}, key {cleared.key}: nothing cleared.", "error")
    else:
        flash(f"{name}, {whose}, key {cleared.key}: override cleared.", "ok")
    return redirect(url_for("ui.key_limits_page"), 303)
