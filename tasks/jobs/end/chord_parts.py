"""A chord's parts as they end: each result kept on the body, and the body released once
every part is in (``tasks.jobs.store.canvas``); a part that ends without a result follows
the chord's failure policy.

The policy is the body's ``on_child_failure`` option (``body.set(on_child_failure=...)``),
BullMQ's flow options in Celery's shape:

- ``fail`` (the default, Celery's ``ChordError``; BullMQ's ``failParentOnFailure``): the
  body fails without running (``tasks.jobs.end.ending.fail_body``);
- ``ignore`` (``ignoreDependencyOnFailure``): the part counts, its entry in the body's
  results an error value, ``{"error": reason, "jobId": part}``;
- ``remove`` (``removeDependencyOnFailure``): the part counts, and is left out of the
  body's results.

Either way the body runs once, when its last part ends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.store import canvas as store
from tasks.jobs.store import jobs as jobs_store
from tasks.jobs.store.jobs import ReadyJob
from tasks.platform.celery_app import app

# A removed part's place among the body's results (never a result: it is not JSON a task
# could return as such, a key no handler's result is expected to carry).
REMOVED_KEY = "keel:removedPart"
_POLICY = text("SELECT celery_ctx ->> 'chordOnFailure' FROM jobs WHERE id = :id")


def keel_task(name: str) -> Any | None:
    """The Keel task called ``name``, or ``None`` for a plain Celery task (or none)."""
    task = app.tasks.get(name)
    return task if task is not None and hasattr(task, "data_for") else None


def part_ended(session: Session, body_id: str, part_id: str, result: Any) -> list[ReadyJob]:
    """Keep a part's result on the body; the body, released, if this was the last part."""
    ctx = store.record_part(session, body_id, part_id, result)
    if ctx is None:
        return []
    parts, results = ctx["chordParts"], ctx.get("chordResults") or {}
    if any(part not in results for part in parts):
        return []
    row = jobs_store.get(session, body_id)
    task = keel_task(row.name) if row is not None else None
    if row is None or task is None:
        return []
    ordered = [results[part] for part in parts if not _removed(results[part])]
    given = list(ctx.get("chordArgs", []))
    if ctx.get("chordImmutable"):
        data = task.data_for(given, ctx.get("chordKwargs", {}))
    elif task.job_style == "context":
        data = {**ctx.get("chordKwargs", {}), "results": ordered}
    else:
        data = task.data_for([ordered, *given], ctx.get("chordKwargs", {}))
    released = store.release_body(session, body_id, data, ctx)
    return [released] if released is not None else []


def part_failed(session: Session, body_id: str, part_id: str, reason: str) -> list[ReadyJob] | None:
    """A part ended without a result: counted by the body's policy (the body, released, if
    it was the last part), or ``None`` when the policy is to fail the body."""
    policy = session.execute(_POLICY, {"id": body_id}).scalar() or "fail"
    if policy == "ignore":
        return part_ended(session, body_id, part_id, {"error": reason, "jobId": part_id})
    if policy == "remove":
        return part_ended(session, body_id, part_id, {REMOVED_KEY: reason})
    return None


def _removed(result: Any) -> bool:
    return isinstance(result, dict) and REMOVED_KEY in result and len(result) == 1
