"""``/api/v1/reports/jobs/<jobId>/events``: one report job's events as Server-Sent Events.

The events are read from the queue's Redis stream, so they come from
whichever process wrote them: the API that added the job, the worker that
ran it, the promoter that republished it. Past events are replayed first;
then new ones follow until the job's terminal event (``completed`` or
``failed``) or until ``timeout`` seconds have passed. A client that
reconnects with ``Last-Event-ID`` resumes after that event.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, g, request

from tasks.jobs import events
from tasks.jobs.models import FINISHED_STATES
from tasks.jobs.queries import get_owned
from tasks.reports.jobs import QUEUE
from web.api import operation
from web.errors import ApiError

bp = Blueprint("events", __name__, url_prefix="/api/v1/reports")

TERMINAL_EVENTS = ("completed", "failed")
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
POLL_S = 0.2
KEEPALIVE_S = 15.0
# A job already finished whose terminal event is not in the stream (trimmed,
# or written a moment after the record) is waited for only this long.
FINISHED_GRACE_S = 2.0
STREAM_ID = re.compile(r"^\d{1,20}(-\d{1,20})?$")


def sse(event: dict[str, Any]) -> str:
    """One event in the ``text/event-stream`` format."""
    return f"id: {event['id']}\nevent: {event['event']}\ndata: {json.dumps(event)}\n\n"


@dataclass
class JobEventStream:
    """Replays, then follows, one job's events in its queue's stream."""

    job_id: str
    queue: str
    cursor: str
    deadline: float
    finished: bool

    def __iter__(self) -> Iterator[str]:
        last = None
        for event in self._new_events():
            last = event["event"]
            yield sse(event)
        if last in TERMINAL_EVENTS:
            return
        if self.finished:
            self.deadline = min(self.deadline, time.monotonic() + FINISHED_GRACE_S)
        yield from self._follow()

    def _new_events(self) -> Iterator[dict[str, Any]]:
        for event in events.read([self.queue], since=self.cursor):
            self.cursor = event["id"]
            if event.get("jobId") == self.job_id:
                yield event

    def _follow(self) -> Iterator[str]:
        quiet_since = time.monotonic()
        while time.monotonic() < self.deadline:
            for event in self._new_events():
                quiet_since = time.monotonic()
                yield sse(event)
                if event["event"] in TERMINAL_EVENTS:
                    return
            if time.monotonic() - quiet_since >= KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keep-alive\n\n"  # lets proxies and clients see the stream is alive
            time.sleep(min(POLL_S, max(0.0, self.deadline - time.monotonic())))


def _timeout_s() -> float:
    raw = request.args.get("timeout")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ApiError(400, f"timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]",
                       code="validation_failed",
                       details=[{"field": "timeout", "message": "out of range",
                                 "type": "value_error"}])  # fmt: skip
    return value


def _resume_after() -> str:
    """Where to start: after ``Last-Event-ID`` if the client sent one, else the beginning."""
    last = request.headers.get("Last-Event-ID", "").strip()
    return last if STREAM_ID.match(last) else "0"


@operation(
    bp,
    "/jobs/<job_id>/events",
    "GET",
    summary="A report job's events as Server-Sent Events (replayed, then live); "
    "ends after completed/failed or ?timeout= seconds (default 30, max 300)",
    responses={200: None, 400: None, 401: None, 404: None},
    produces="text/event-stream",
)
def job_events(job_id: str):
    timeout_s = _timeout_s()
    principal = g.principal
    job = get_owned(job_id, principal.owner, queue=QUEUE, tenant_wide=principal.operator)
    stream = JobEventStream(
        job_id=job.id,
        queue=job.queue,
        cursor=_resume_after(),
        deadline=time.monotonic() + timeout_s,
        finished=job.state in FINISHED_STATES,
    )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Response(iter(stream), mimetype="text/event-stream", headers=headers)
