"""Submit: a tenant's user adds a job of a type declared ``submittable`` (``POST /api/v1/jobs``).

Judged like a scheduler's template, when it is made: the type must exist and
be submittable; its data must be what the type's ``data`` model accepts and
claim no identity (the job belongs to the caller's tenant and user, from the
token); the job runs on the type's own queue, under the tenant's quota.

Data takes one of two forms. ``data`` (an object) is stored as given: it is
what a handler reads (``job.data``). For a Celery-style task
(``run(*args, **kwargs)``), ``args`` and ``kwargs`` may be given instead and
are stored the way ``.delay()`` would store them (``KeelTask.data_for``:
``{"args": [...], "kwargs": {...}}``).

The caller cannot name the job (``jobId``) or its deduplication id: both are
keys shared by every tenant on a queue, so choosing them would let one tenant
collide with, or probe for, another tenant's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tasks.jobs.intake.enqueue import AddedJob, add
from tasks.jobs.model import registry
from tasks.jobs.model.errors import Refused
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner
from tasks.platform.setting_types import TenantLimits


class SubmissionRefused(Refused):
    """The job cannot be submitted as asked."""

    code = "validation_failed"

    def __init__(self, where: str, message: str) -> None:
        detail = {"field": where, "type": "submission", "message": message}
        super().__init__(f"the job is refused: {message}", details=[detail])


@dataclass(frozen=True)
class Submission:
    """What the caller asked for: a job type, its data (or Celery-style arguments), options."""

    name: str
    data: dict[str, Any] | None = None
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    opts: JobOptions = field(default_factory=JobOptions)


def task_style(name: str) -> str:
    """How the Celery task behind ``name`` takes its data: ``context`` or ``celery``."""
    from tasks.platform.celery_app import app

    task = app.tasks.get(name)
    return str(getattr(task, "job_style", "context"))


def _data_of(submission: Submission) -> dict[str, Any]:
    celery_style = submission.args is not None or submission.kwargs is not None
    if celery_style and submission.data is not None:
        raise SubmissionRefused("data", "give either data or args/kwargs, not both")
    if not celery_style:
        return submission.data or {}
    if task_style(submission.name) != "celery":
        raise SubmissionRefused(
            "args" if submission.args is not None else "kwargs",
            f"{submission.name!r} takes its data as an object (data), not args/kwargs",
        )
    return {"args": list(submission.args or []), "kwargs": dict(submission.kwargs or {})}


def _claimed_identity(data: dict[str, Any]) -> list[str]:
    """Identity fields in the data, or in the keyword arguments it holds."""
    found = registry.owner_fields_in(data)
    named = data.get("kwargs")
    return found + (registry.owner_fields_in(named) if isinstance(named, dict) else [])


def check_data(job_type: registry.JobType, data: dict[str, Any], where: str) -> None:
    claimed = _claimed_identity(data)
    if claimed:
        raise SubmissionRefused(
            where, f"{claimed[0]}: identity comes from the token, never from data"
        )
    if job_type.data is None:
        return
    try:
        job_type.data.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        inner = ".".join(str(p) for p in first["loc"])
        raise SubmissionRefused(where, f"{inner or '(data)'}: {first['msg']}") from None


def submittable(name: str) -> registry.JobType:
    """The job type called ``name``, if a tenant's user may submit it."""
    job_type = registry.get(name)
    if job_type is None or not job_type.submittable:
        raise SubmissionRefused("name", f"no job that tenants may submit is called {name!r}")
    return job_type


def submit(
    owner: Owner, submission: Submission, limits: TenantLimits, job_id: str | None = None
) -> AddedJob:
    """Add the job for ``owner`` on its type's queue, within ``limits``. ``job_id``: the id
    the API derived from the request's ``Idempotency-Key`` (a job of that id is found, not
    made again); a submission's own ``jobId`` is refused."""
    job_type = submittable(submission.name)
    if submission.opts.job_id is not None or submission.opts.deduplication is not None:
        raise SubmissionRefused("opts", "jobId and deduplication are not accepted")
    data = _data_of(submission)
    check_data(job_type, data, "kwargs" if submission.kwargs is not None else "data")
    opts = (
        submission.opts if job_id is None else submission.opts.model_copy(update={"job_id": job_id})
    )
    return add(
        job_type.name,
        data,
        queue=job_type.queue,
        opts=opts,
        owner=owner,
        limits=limits,
    )
