"""How a failed run is described: the reason users see, and the stack operators keep.

A handler's exception text is shown to whoever owns the job (``failedReason``).
SQLAlchemy's errors quote the statement and its parameters, so a database error
is described by the driver's own message (``value too long for type ...``)
instead: the job's owner learns what went wrong, never the SQL behind it.
"""

from __future__ import annotations

import traceback

from celery.exceptions import Reject, TimeLimitExceeded
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

MAX_REASON_CHARS = 1000


def _database_reason(exc: SQLAlchemyError) -> str:
    original = exc.orig if isinstance(exc, DBAPIError) else None
    if original is None:
        return f"database error ({type(exc).__name__})"
    first_line = (str(original).strip().splitlines() or [""])[0]
    return f"database error ({type(original).__name__}): {first_line}".rstrip(": ")


def reason(exc: BaseException) -> str:
    """The one-line reason recorded as ``failedReason``."""
    if isinstance(exc, SQLAlchemyError):
        text = _database_reason(exc)
    elif isinstance(exc, Reject):  # Celery's Reject(reason, requeue): the reason alone
        text = str(exc.reason)
    elif isinstance(exc, TimeLimitExceeded) and exc.args and isinstance(exc.args[0], str):
        text = exc.args[0]  # its str() is its repr: "TimeLimitExceeded('…',)"
    else:
        text = str(exc) or type(exc).__name__
    return text[:MAX_REASON_CHARS]


def stack(exc: BaseException) -> list[str]:
    """The traceback kept with the record (the audit copies it on a manual retry)."""
    if isinstance(exc, SQLAlchemyError):  # the frames, without the statement text
        frames = "".join(traceback.format_tb(exc.__traceback__))
        return [f"Traceback (most recent call last):\n{frames}{type(exc).__name__}: {reason(exc)}"]
    return ["".join(traceback.format_exception(exc))]


def kind(exc: BaseException) -> dict[str, str]:
    """The exception's type as Celery serializes it (``exc_type``, ``exc_module``), kept with
    the failed run so that ``AsyncResult.get()`` raises the same type where it is loaded."""
    if isinstance(exc, SQLAlchemyError) and isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig  # the driver's error, as the reason names it
    exctype = type(exc)
    return {"exc_type": exctype.__qualname__, "exc_module": exctype.__module__}
