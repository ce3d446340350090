"""What happens, in the same transaction, when a job reaches completed or failed.

Retention follows BullMQ's ``removeOnComplete`` / ``removeOnFail``: the
finishing job's setting trims its queue's finished records of the same
kind, lazily, at the moment another job finishes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.records import ClaimedJob


def retention(setting: Any) -> tuple[int | None, int | None] | None:
    """``(count, age_s)`` to keep, or ``None`` to keep everything."""
    if setting is None or setting is False:
        return None
    if setting is True:
        return (0, None)
    if isinstance(setting, int):
        return (setting, None)
    return (setting.get("count"), setting.get("age"))


def trim(session: Session, queue: str, state: str, setting: Any) -> int:
    """Delete finished records beyond the newest ``count`` or older than ``age``."""
    keep = retention(setting)
    if keep is None:
        return 0
    count, age = keep
    removed = 0
    if count is not None:
        removed += (
            session.execute(
                text(
                    """
                DELETE FROM jobs WHERE id IN (
                    SELECT id FROM jobs WHERE queue = :queue AND state = :state
                    ORDER BY finished_on DESC OFFSET :count
                    FOR UPDATE SKIP LOCKED)
                """
                ),
                {"queue": queue, "state": state, "count": count},
            ).rowcount
            or 0
        )
    if age is not None:
        removed += (
            session.execute(
                text(
                    "DELETE FROM jobs WHERE queue = :queue AND state = :state "
                    "AND finished_on < clock_timestamp() - make_interval(secs => :age)"
                ),
                {"queue": queue, "state": state, "age": age},
            ).rowcount
            or 0
        )
    return removed


def on_finished(session: Session, job: ClaimedJob | Any, state: str) -> None:
    key = "removeOnComplete" if state == "completed" else "removeOnFail"
    trim(session, job.queue, state, job.opts.get(key))
