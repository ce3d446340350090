"""What each job type declares about itself: its queue, who may schedule it, its data.

The declaration sits on the handler (``handler(name, queue=..., schedulable=...,
data=...)``) so that a scheduler template is judged when it is upserted, the
way an API call is judged when it is made — never at fire time, where a bad
template could only fail (or, worse, run with someone else's identity).

- ``schedulable="tenant"``: a tenant's operator may schedule it; the fired job
  is owned by the scheduler's tenant and user.
- ``schedulable="system"`` (the default): only the CLI's system scope may,
  e.g. retention or monitoring jobs that act on every tenant's data.

``submittable=True``: a tenant's user may add it directly over HTTP
(``POST /api/v1/jobs``), with ``data`` checked like a template's.

``data`` is the model of what a tenant may put in the job's data; identity
never travels in data (``OWNER_FIELDS`` are refused whatever the model says),
because handlers read it from the job's owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from tasks.jobs.model.errors import TemplateRefused

Schedulable = Literal["tenant", "system"]

# Data keys that would claim an identity; compared case-insensitively, ignoring "_" and "-".
OWNER_FIELDS = frozenset(
    {"tenant", "tenantid", "user", "userid", "requestedby", "owner", "ownerid", "createdby", "sub"}
)


@dataclass(frozen=True)
class JobType:
    """One registered job name and what it allows."""

    name: str
    queue: str
    schedulable: Schedulable = "system"
    data: type[BaseModel] | None = None
    submittable: bool = False
    # A control job (a campaign's group creation, send, finalize): published at the
    # front of its queue, so it never waits behind the bulk work it unblocks.
    control: bool = False


_TYPES: dict[str, JobType] = {}


def declare(job_type: JobType) -> None:
    _TYPES[job_type.name] = job_type


def get(name: str) -> JobType | None:
    return _TYPES.get(name)


def is_control(name: str) -> bool:
    """Whether jobs called ``name`` go to the front of their queue (``handler(control=True)``)."""
    found = _TYPES.get(name)
    return found is not None and found.control


def names() -> list[str]:
    return sorted(_TYPES)


def queues() -> list[str]:
    """Every queue a declared job type runs on."""
    return sorted({job_type.queue for job_type in _TYPES.values()})


def _normalized(key: str) -> str:
    return key.replace("_", "").replace("-", "").lower()


def owner_fields_in(data: dict[str, Any]) -> list[str]:
    return sorted(key for key in data if _normalized(key) in OWNER_FIELDS)


def _refuse(field: str, message: str) -> TemplateRefused:
    detail = {"field": field, "type": "template", "message": message}
    return TemplateRefused(f"the job template is refused: {message}", details=[detail])


def check_template(name: str, data: dict[str, Any], queue: str | None, *, tenant: bool) -> JobType:
    """The job type a scheduler may fire, or ``TemplateRefused`` saying why not.

    ``tenant``: the scheduler belongs to a tenant (API, or the CLI's ``--tenant``).
    """
    job_type = get(name)
    if job_type is None:
        raise _refuse("template.name", f"no job is called {name!r}")
    if tenant and job_type.schedulable != "tenant":
        raise _refuse("template.name", f"{name!r} can only be scheduled by the system (CLI)")
    if queue is not None and queue != job_type.queue:
        raise _refuse("queue", f"{name!r} runs on queue {job_type.queue!r}, not {queue!r}")
    claimed = owner_fields_in(data)
    if claimed:
        raise _refuse(
            "template.data",
            f"{claimed[0]}: identity comes from the scheduler's owner, never from data",
        )
    if job_type.data is not None:
        try:
            job_type.data.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "(data)"
            raise _refuse("template.data", f"{where}: {first['msg']}") from None
    return job_type
