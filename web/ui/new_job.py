"""Add a job from the dashboard: a job type tenants may submit, and a form made from its data.

The page lists the types ``POST /api/v1/jobs`` accepts (declared ``submittable``); once one
is picked (``?name=``), its form has one input per property of the type's data model
(``web.ui.schema_form``), or a JSON text area for a type without a model — and for a
Celery-style task (``run(*args, **kwargs)``) one for ``args`` and one for ``kwargs`` — plus
the options a tenant's user may set here: attempts and a delay.

The form is turned into the API's body (``SubmitJob``), validated by the same model and
added by the same ``submit_for``: the job is the signed-in user's, under the tenant's
quotas. A refusal (400 naming a field, 429 at a quota) is shown on the form with the
API's message and the values as they were typed; a success opens the new job's page.
"""

from __future__ import annotations

from typing import Any

from flask import g, redirect, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs.intake.submit import task_style
from tasks.jobs.model import registry
from tasks.jobs.model.errors import JobNotFound, KeelError
from tasks.platform import quotas
from web.api import check_payload, load_json, validate
from web.errors import status_of
from web.jobs import SubmitJob, submit_for
from web.ui import bp
from web.ui.forms import explained
from web.ui.schema_form import WHOLE_NUMBER, FormField, data_from, fields_of
from web.ui.session import signed_in

MAX_ATTEMPTS = 100  # SubmitOptions.attempts' bound


def submittable_types() -> list[registry.JobType]:
    """The job types a tenant's user may add, by name."""
    load_job_modules()  # every job type declared, as the API's submit does
    found = (registry.get(name) for name in registry.names())
    return [job_type for job_type in found if job_type is not None and job_type.submittable]


def _chosen(name: str | None) -> registry.JobType | None:
    return next((t for t in submittable_types() if t.name == name), None) if name else None


def _form_kind(job_type: registry.JobType) -> str:
    """How the type's data is typed in: ``args`` (Celery-style), ``fields`` or ``json``."""
    if task_style(job_type.name) == "celery":
        return "args"
    return "fields" if job_type.data is not None else "json"


def _fields(job_type: registry.JobType | None) -> list[FormField]:
    if job_type is None or job_type.data is None or _form_kind(job_type) != "fields":
        return []
    return fields_of(job_type.data)


def _page(
    job_type: registry.JobType | None, form: MultiDict, status: int = 200, **more: Any
) -> Any:
    fields = _fields(job_type)
    if not form:  # a fresh form: the schema's defaults
        form = MultiDict({f.input_name: f.shown_default() for f in fields if f.shown_default()})
    page = render_template(
        "ui/new_job.html",
        types=submittable_types(),
        chosen=job_type,
        form_kind=_form_kind(job_type) if job_type is not None else None,
        fields=fields,
        form=form,
        max_attempts=MAX_ATTEMPTS,
        max_delay_s=quotas.current().max_delay_seconds,
        **more,
    )
    return page, status


@bp.get("/jobs/new")
@signed_in()
def new_job() -> Any:
    name = request.args.get("name") or None
    job_type = _chosen(name)
    if name is not None and job_type is None:
        message = f"no job that tenants may submit is called {name!r}"
        return _page(None, MultiDict(), 404, error=message)
    return _page(job_type, MultiDict())


def _json_field(form: MultiDict, field: str, default: str) -> Any:
    text = form.get(field, "").strip() or default
    return load_json(text, field)


def _body(job_type: registry.JobType, form: MultiDict) -> dict[str, Any]:
    """The form as the body of ``POST /api/v1/jobs``."""
    body: dict[str, Any] = {"name": job_type.name}
    kind = _form_kind(job_type)
    if kind == "args":
        body["args"] = _json_field(form, "args", "[]")
        body["kwargs"] = _json_field(form, "kwargs", "{}")
    elif kind == "json":
        body["data"] = _json_field(form, "data", "{}")
    else:
        body["data"] = data_from(_fields(job_type), form)
    opts: dict[str, Any] = {}
    for option, scale in (("attempts", 1), ("delay", 1000)):  # the delay is typed in seconds
        text = form.get(option, "").strip()
        if text:  # not a number: left as typed, for the API's model to refuse by name
            opts[option] = int(text) * scale if WHOLE_NUMBER.fullmatch(text) else text
    body["opts"] = opts
    return body


@bp.post("/jobs/new")
@signed_in()
def add_job() -> Any:
    form = request.form
    name = form.get("name", "")
    job_type = _chosen(name)
    try:
        # an unknown name is refused by submit_for as the API refuses it: 400 on name
        body = check_payload({"name": name} if job_type is None else _body(job_type, form))
        submission = validate(SubmitJob, body)
        assert isinstance(submission, SubmitJob)
        added = submit_for(g.principal, submission)
    except JobNotFound:
        raise
    except KeelError as refused:
        status = status_of(refused)
        if status >= 500:
            raise
        return _page(job_type, form, status, error=explained(refused), refused=refused.details)
    return redirect(url_for("ui.job", job_id=added.job_id), 303)
