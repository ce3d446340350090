"""The root of every error Keel raises, and of the control-flow signals.

They live here, below every layer, so that infrastructure (settings, the
transport) raises the same family the job layer does; ``tasks.jobs.model.errors``
builds the job layer's refusals on them.
"""

from __future__ import annotations

from typing import Any


class KeelError(Exception):
    """Keel could not do what was asked: the root of every error Keel raises.

    It carries a message and ``details`` (a list, for a client or a log);
    nothing about HTTP.
    """

    code = "keel_error"

    def __init__(self, message: str | None = None, *, details: list[Any] | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip().splitlines()[0])
        self.details = details or []


class ControlFlow(KeelError):
    """How a handler or the job layer says what happens next; never a caller's error."""

    code = "control_flow"
