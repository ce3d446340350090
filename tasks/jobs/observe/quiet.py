"""Quiet jobs: periodic system jobs whose routine runs stay out of the console.

``campaign.monitor`` runs every 10 s; with Celery's INFO lines for each run
(worker: received, succeeded; beat: fired) it wrote three lines every 10 s
into ``keel up``'s console, burying what people read it for. A handler
declared ``handler(..., quiet=True)`` has those lines kept at DEBUG: shown
with ``-l DEBUG``, dropped at INFO. A failure, a retry or any warning of a
quiet job is logged as usual; its records and events are kept.

Celery logs the routine lines from ``celery.worker.strategy`` (received) and
``celery.app.trace`` (succeeded, ignored), each with the task's ``name`` in
the record's ``data``; a filter on those two loggers reads it. Prefork
children inherit the filters with the loggers.
"""

from __future__ import annotations

import logging

ROUTINE_LOGGERS = ("celery.worker.strategy", "celery.app.trace")
_QUIET: set[str] = set()


def declare(name: str) -> None:
    """Keep the routine lines of jobs called ``name`` at DEBUG."""
    _QUIET.add(name)
    for logger_name in ROUTINE_LOGGERS:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, RoutineLines) for f in logger.filters):
            logger.addFilter(RoutineLines())


def names() -> tuple[str, ...]:
    """The quiet job names declared in this process, sorted."""
    return tuple(sorted(_QUIET))


def level_for(name: str) -> int:
    """The level of a routine line about a job called ``name``."""
    return logging.DEBUG if name in _QUIET else logging.INFO


class RoutineLines(logging.Filter):
    """Drops INFO lines about quiet jobs unless the logger is at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        data = getattr(record, "data", None)
        name = data.get("name") if isinstance(data, dict) else None
        if not isinstance(name, str) or name not in _QUIET:
            return True
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
