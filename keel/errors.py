"""Why ``keel up`` will not start: refusals it says in one line, before anything runs."""

from __future__ import annotations

from tasks.jobs.model.errors import KeelError


class StartRefused(KeelError):
    """``keel up`` cannot start this stack as configured; the message says what to change."""

    code = "start_refused"
