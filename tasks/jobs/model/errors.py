"""The job layer's exceptions: one root, and the control-flow errors handlers raise."""

from __future__ import annotations

from typing import Any


class KeelError(Exception):
    """Keel could not do what was asked.

    The root of every error Keel raises. ``status`` and ``code`` say how the
    HTTP API answers it — the web layer has one handler that maps them — and
    ``details`` (a list) and ``headers`` travel with the answer.
    """

    code = "keel_error"
    status = 400

    def __init__(
        self,
        message: str | None = None,
        *,
        details: list[Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message or (self.__doc__ or "").strip().splitlines()[0])
        self.details = details or []
        self.headers = headers or {}


class JobNotFound(KeelError):
    """No such job."""

    code = "not_found"
    status = 404


class InvalidJobState(KeelError):
    """The job is not in a state that allows this."""

    code = "invalid_state"


class JobConflict(KeelError):
    """Another job or result already covers this operation."""

    code = "conflict"
    status = 409


class TemplateRefused(KeelError):
    """A scheduler's job template asks for something its owner may not schedule."""

    code = "validation_failed"


class QuotaExceeded(KeelError):
    """The tenant is at one of its quotas (``details`` name the limit)."""

    code = "quota_exceeded"
    status = 429


class LimitExceeded(KeelError):
    """The request is bigger or further out than a tenant may ask for (a shape limit)."""

    code = "validation_failed"


class UnrecoverableError(KeelError):
    """Fail the job now, whatever attempts remain (BullMQ's ``UnrecoverableError``)."""

    code = "unrecoverable"


class BrokerUnavailable(KeelError):
    """The broker could not be reached."""

    code = "broker_unavailable"
    status = 503


class Defer(KeelError):
    """Run this job again after ``delay_ms`` without using up an attempt.

    BullMQ's ``moveToDelayed`` + ``DelayedError``; with ``waiting_children``
    the job is parked as ``waiting-children`` (it waits for a job it added).
    """

    code = "deferred"

    def __init__(
        self, delay_ms: int, reason: str = "deferred", *, waiting_children: bool = False
    ) -> None:
        super().__init__(reason)
        self.delay_ms = delay_ms
        self.waiting_children = waiting_children
