"""Who a job belongs to: a tenant and a user within it, always taken from a token."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    """A job's tenant and user; the API only ever shows a job to its owner (or to an
    operator of its tenant)."""

    tenant_id: str
    user_id: str


# Whose jobs a block of code sends (``acting_as``), and the owner of the job whose handler
# is running (``KeelTask``), if it is a tenant's.
_OWNER: ContextVar[Owner | None] = ContextVar("keel_owner", default=None)
_RUNNING: ContextVar[Owner | None] = ContextVar("keel_running_owner", default=None)


@contextmanager
def acting_as(owner: Owner) -> Iterator[Owner]:
    """Jobs sent in this block (``.delay()`` included) belong to ``owner``."""
    token = _OWNER.set(owner)
    try:
        yield owner
    finally:
        _OWNER.reset(token)


def current_owner() -> Owner | None:
    """The owner set by ``acting_as`` around this call, else that of the running job (a
    tenant's), if any."""
    return _OWNER.get() or _RUNNING.get()


@contextmanager
def running_for(owner: Owner | None) -> Iterator[None]:
    """The handler of ``owner``'s job runs in this block: what it sends the Celery way is
    ``owner``'s, as the job's chain steps and links are, and like them it is part of work
    the tenant's quota already admitted (not checked again). ``acting_as`` or an
    ``owner=`` inside the block still decides."""
    token = _RUNNING.set(owner)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def acting() -> Owner | None:
    """The owner ``acting_as`` set around this call, if any."""
    return _OWNER.get()


def running() -> Owner | None:
    """The owner of the running job, if it is a tenant's (``running_for``)."""
    return _RUNNING.get()
