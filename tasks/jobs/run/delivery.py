"""A delivery: what its message says, and how one that will not run is let go.

Celery hands ``KeelTask`` a message; what it says (the queue it came from, whether Keel
recorded it, the canvas it belongs to) is read here, and so are the ways a delivery ends
without a run: ignored (a ``task-ignored`` event, so Flower does not show it started
forever), held by its queue's pause, or given back to the broker while the records
cannot be reached. A message sent without Keel is recorded on arrival.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject
from sqlalchemy.orm import Session

from tasks.jobs.calls.celery_task import CeleryTask
from tasks.jobs.end import ending
from tasks.jobs.intake import tenancy
from tasks.jobs.intake.celery_options import with_options
from tasks.jobs.model.formats import KEEL_HEADER
from tasks.jobs.model.models import State
from tasks.jobs.store import jobs as store
from tasks.jobs.store import runs
from tasks.jobs.store.jobs import NewJob
from tasks.jobs.store.pauses import Hold
from tasks.platform import tracing

log = logging.getLogger(__name__)

# How long a delivery that found the records unreachable waits before going back to the queue.
STORE_UNAVAILABLE_PAUSE_S = 1.0
PAUSED = "its queue is paused: held until the pause is lifted"
PAUSED_STALLED = "its queue is paused and its last run's worker is gone: requeued, then held"


def recorded(task: CeleryTask) -> bool:
    """Whether Keel sent the message, so that its record exists (or is being committed)."""
    return bool(getattr(task.request, KEEL_HEADER, None))


def queue(task: CeleryTask) -> str:
    """The queue this delivery came from: a job may be added on any queue."""
    info = task.request.delivery_info or {}
    return str(info.get("routing_key") or task.queue)


def canvas_context(task: CeleryTask) -> dict[str, Any] | None:
    """The canvas this delivery belongs to (chord, chain, links), kept on the record so a
    later run — retried, promoted, redelivered — still counts toward its chord and
    still triggers its children."""
    request = task.request
    ctx = {
        "chord": request.chord,
        "group": request.group,
        "group_index": request.group_index,
        "chain": request.chain,
        "link": request.callbacks,
        "link_error": request.errbacks,
        "parent_id": request.parent_id,
        "root_id": request.root_id,
    }
    limits = list(request.timelimit or ())  # the sender's time_limit / soft_time_limit
    if any(limit is not None for limit in limits):
        ctx["timelimit"] = limits
    kept = {key: value for key, value in ctx.items() if value not in (None, [], ())}
    return kept or None


def message_priority(request: Any) -> Any:
    """The priority a message arrived with (its sender's ``priority=``; ``None``: none)."""
    return (getattr(request, "delivery_info", None) or {}).get("priority")


def announce_ignored(task: CeleryTask, reason: str) -> None:
    """A ``task-ignored`` event: Flower shows the delivery as IGNORED, not STARTED."""
    if not task.send_events:
        return  # a task kept out of Flower (``handler(events=False)``) had no STARTED either
    try:
        task.send_event("task-ignored", reason=reason)
    except Exception as exc:  # events are for watching; a lost one changes nothing
        log.debug("could not announce ignored delivery %s: %s", task.request.id, exc)


def ignore_if_held(task: CeleryTask, found: Hold) -> None:
    """A job its queue's pause holds (``tasks.jobs.intake.pauses``) is not run: ignored."""
    if found is Hold.HELD:
        announce_ignored(task, PAUSED)
        raise Ignore()
    if found is Hold.LEAVE:
        announce_ignored(task, PAUSED_STALLED)
        raise Ignore()


def requeue_while_store_unavailable(task: CeleryTask, exc: Exception) -> NoReturn:
    """The records cannot be reached: put the message back rather than lose it.

    Nothing has run and nothing was recorded, so the delivery is simply
    given back to the broker (at the back of its queue) after a short
    pause, and is tried again until the database answers. Acknowledging
    it — what a plain exception here does — would leave a waiting record
    that no message will ever wake.
    """
    log.warning(
        "job store unavailable; job %s goes back to its queue: %s",
        task.request.id,
        exc.__class__.__name__,
    )
    time.sleep(STORE_UNAVAILABLE_PAUSE_S)
    raise Reject(str(exc), requeue=True) from exc


def record_on_arrival(task: CeleryTask, session: Session, args: Any, kwargs: Any) -> None:
    """A message sent without Keel (``send_task`` by name, another app): record it now.

    Its record is added as waiting in the claim's transaction (nothing if a
    job with its id exists), so the claim runs it like any other job. Arguments
    the handler cannot take (positional ones for a ``handler(job)`` task) are
    recorded as given, and the job fails at once saying why: run, it would
    read them as its data.
    """
    refused = None
    try:
        data = task.data_for(args, kwargs)
    except TypeError as exc:
        data, refused = {"args": list(args), "kwargs": dict(kwargs)}, str(exc)
    opts = task.default_options(data, None)
    job = NewJob(
        id=str(task.request.id),
        name=task.name,
        queue=queue(task),
        data=data,
        tenant_id=None,
        user_id=None,
        opts=opts,
        celery_ctx=tracing.carried(with_options(canvas_context(task), opts)),
        priority=tenancy.rank(message_priority(task.request)),
    )
    if not store.insert(session, job):
        return
    log.info("job %s (%s) arrived without a record; recorded on arrival", job.id, job.name)
    if refused is None:
        return
    failed = runs.fail_unsupported(session, job.id, job.name, refused)
    if failed is not None:
        ending.ended(session, failed, State.FAILED, refused)
