"""What the dashboard's forms share: running an action and showing its outcome."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import flash, redirect

from tasks.jobs.model.errors import JobNotFound, KeelError


def explained(error: KeelError) -> str:
    """The API's message, with the fields a validation error names."""
    found = [
        f"{d['field']}: {d['message']}"
        for d in error.details
        if isinstance(d, dict) and "field" in d and "message" in d
    ]
    return f"{error} ({'; '.join(found)})" if found else str(error)


def act(back: str, action: Callable[[], Any], done: str | Callable[[Any], str]) -> Any:
    """Run a form's action; its outcome (or the API's refusal) is shown on the ``back`` page.

    ``done`` says what happened (or says it from what the action returned). A missing (or
    foreign) object is not a refusal but the 404 the API answers.
    """
    try:
        outcome = action()
    except JobNotFound:
        raise
    except KeelError as refused:
        flash(explained(refused), "error")
    else:
        flash(done(outcome) if callable(done) else done, "ok")
    return redirect(back, 303)
