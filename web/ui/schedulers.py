"""Job schedulers of the operator's tenant: list, next fire times, create, edit, remove.

Operators only, as in the API. The form is turned into the body of
``PUT /api/v1/schedulers/<id>`` and validated by the same model
(``UpsertScheduler``), then saved by the same ``upsert_for``: a template the
API would refuse is refused here with the same message. A scheduler's page
lists the jobs it fired (their ids start with its ``fire_prefix``), and pauses, resumes or
runs it now, as ``POST /api/v1/schedulers/<id>/pause|resume|trigger`` do.
"""

from __future__ import annotations

import json
import re
from typing import Any

from flask import flash, g, redirect, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from tasks.jobs.model import registry
from tasks.jobs.model.errors import KeelError, Refused
from tasks.jobs.observe.queries import JobFilter, list_jobs
from tasks.jobs.schedule import schedulers
from web.api import check_payload, load_json, validate
from web.auth import OPERATOR
from web.errors import status_of
from web.job_views import describe
from web.schedulers import UpsertScheduler, pause_for, scope_of, trigger_for, upsert_for
from web.ui import bp
from web.ui.forms import explained
from web.ui.session import signed_in

PRODUCED_SHOWN = 20
# ASCII digits only: str.isdigit() also takes "²" and "①" (int() then raises) and "١٢"
WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")
EMPTY_FORM = MultiDict(
    {"rule": "pattern", "tz": "UTC", "data": "{}", "opts": "{}", "overlap": "allow"}
)
OUTCOMES = {
    "added": "Scheduler {id} ran now: job {job}.",
    "skipped": "Scheduler {id} did not run: its last job is still live (overlap {overlap}).",
    "buffered": "Scheduler {id} will run once its last job ends (overlap buffer).",
}


def _tenant_schedulable() -> list[str]:
    return [n for n in registry.names() if (t := registry.get(n)) and t.schedulable == "tenant"]


def _form_of(described: dict[str, Any]) -> MultiDict:
    """A stored scheduler as the form's fields."""
    template = described.get("template", {})
    fields = {
        "id": described["id"],
        "rule": "every" if described.get("every") is not None else "pattern",
        "pattern": described.get("pattern") or "",
        "every": str(described.get("every") or ""),
        "tz": described.get("tz", "UTC"),
        "limit": str(described.get("limit") or ""),
        "name": template.get("name", ""),
        "data": _json(template.get("data", {})),
        "opts": _json(template.get("opts", {})),
        "overlap": described.get("overlap", "allow"),
        "catchUp": described.get("catchUp", "earliest"),
        "catchUpWindow": str(described.get("catchUpWindow") or ""),
        "jitter": str(described.get("jitter") or ""),
    }
    for flag in ("immediately", "paused"):
        if described.get(flag):
            fields[flag] = "on"
    return MultiDict(fields)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2)


def _editor(form: MultiDict, status: int = 200, **more: Any) -> Any:
    page = render_template("ui/scheduler.html", form=form, job_names=_tenant_schedulable(), **more)
    return page, status


@bp.get("/schedulers")
@signed_in(OPERATOR)
def schedulers_page() -> Any:
    found = [schedulers.describe(r) for r in schedulers.list_all(scope_of(g.principal))]
    return render_template("ui/schedulers.html", schedulers=found)


@bp.get("/new-scheduler")
@signed_in(OPERATOR)
def new_scheduler() -> Any:
    return _editor(EMPTY_FORM, new=True)


@bp.get("/schedulers/<scheduler_id>")
@signed_in(OPERATOR)
def scheduler(scheduler_id: str) -> Any:
    tenant = g.principal.tenant_id
    described = schedulers.describe(schedulers.get(scope_of(g.principal), scheduler_id))
    where = JobFilter(tenant_id=tenant, id_prefix=schedulers.fire_prefix(tenant, scheduler_id))
    produced = [describe(job) for job in list_jobs(where, limit=PRODUCED_SHOWN).jobs]
    return _editor(_form_of(described), scheduler=described, produced=produced)


def _body(form: MultiDict) -> dict[str, Any]:
    """The API's body for the form (a number field that is not a number: a 400 naming it)."""
    body: dict[str, Any] = {"tz": form.get("tz") or "UTC"}
    if form.get("rule") == "every":
        body["every"] = _integer(form, "every")
    else:
        body["pattern"] = form.get("pattern", "")
    if form.get("immediately"):
        body["immediately"] = True
    if form.get("limit"):
        body["limit"] = _integer(form, "limit")
    body["overlap"] = form.get("overlap") or "allow"
    body["catchUp"] = form.get("catchUp") or "earliest"
    for field in ("catchUpWindow", "jitter"):
        if form.get(field):
            body[field] = _integer(form, field)
    body["paused"] = bool(form.get("paused"))
    body["template"] = {
        "name": form.get("name", ""),
        "data": load_json(form.get("data") or "{}", "template.data"),
        "opts": load_json(form.get("opts") or "{}", "template.opts"),
    }
    return body


def _integer(form: MultiDict, field: str) -> int:
    raw = (form.get(field) or "").strip()
    if not WHOLE_NUMBER.fullmatch(raw):
        raise Refused(
            f"{field} must be a whole number",
            details=[{"field": field, "type": "int", "message": "a whole number"}],
        )
    return int(raw)


@bp.post("/schedulers")
@signed_in(OPERATOR)
def save_scheduler() -> Any:
    """Create or update (by id, like ``PUT``); a refusal shows the form again with the reason."""
    form = request.form
    scheduler_id = form.get("id", "")
    try:
        check_payload(form.to_dict())
        body = validate(UpsertScheduler, _body(form))
        assert isinstance(body, UpsertScheduler)
        upsert_for(g.principal, scheduler_id, body)
    except KeelError as refused:
        return _editor(form, status_of(refused), error=explained(refused), new=True)
    flash(f"Scheduler {scheduler_id} saved.", "ok")
    return redirect(url_for("ui.scheduler", scheduler_id=scheduler_id), 303)


@bp.post("/schedulers/<scheduler_id>/remove")
@signed_in(OPERATOR)
def remove_scheduler(scheduler_id: str) -> Any:
    schedulers.remove(scope_of(g.principal), scheduler_id)  # a foreign id: 404, as in the API
    flash(f"Scheduler {scheduler_id} removed.", "ok")
    return redirect(url_for("ui.schedulers_page"), 303)


@bp.post("/schedulers/<scheduler_id>/pause")
@signed_in(OPERATOR)
def pause_scheduler(scheduler_id: str) -> Any:
    pause_for(g.principal, scheduler_id, True)  # a foreign id: 404, as in the API
    flash(f"Scheduler {scheduler_id} paused.", "ok")
    return redirect(url_for("ui.scheduler", scheduler_id=scheduler_id), 303)


@bp.post("/schedulers/<scheduler_id>/resume")
@signed_in(OPERATOR)
def resume_scheduler(scheduler_id: str) -> Any:
    pause_for(g.principal, scheduler_id, False)
    flash(f"Scheduler {scheduler_id} resumed.", "ok")
    return redirect(url_for("ui.scheduler", scheduler_id=scheduler_id), 303)


@bp.post("/schedulers/<scheduler_id>/trigger")
@signed_in(OPERATOR)
def trigger_scheduler(scheduler_id: str) -> Any:
    """Run now; what the overlap policy made of it is the flash."""
    fired = trigger_for(g.principal, scheduler_id)
    overlap = schedulers.describe(schedulers.get(scope_of(g.principal), scheduler_id))["overlap"]
    said = OUTCOMES[fired["outcome"]].format(id=scheduler_id, job=fired["jobId"], overlap=overlap)
    flash(said, "ok")
    return redirect(url_for("ui.scheduler", scheduler_id=scheduler_id), 303)
