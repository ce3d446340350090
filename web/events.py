"""A job's events as Server-Sent Events: ``/api/v1/jobs/<jobId>/events`` (any job the caller
may read, ``web.jobs``) and ``/api/v1/reports/jobs/<jobId>/events`` (a report job's).

The events are read from the queue's Redis stream, so they come from
whichever process wrote them: the API that added the job, the worker that
ran it, the promoter that republished it. Past events are replayed first;
then new ones follow until the job's terminal event (``completed``,
``failed`` or ``cancelled``) or until ``timeout`` seconds have passed. A
client that reconnects with ``Last-Event-ID`` resumes after that event.

A stream holds a server thread while it is open, so it lets go as soon as
it has no reason to stay: a client that closed its connection is noticed at
the next poll (well within 5 s, not at the next keep-alive write), a server
that is stopping ends it, and a server with no stream slot left answers 503
(``web.serving``), as does a stream past its user's or tenant's share of the
open streams (``web.stream_leases``). While Redis does not answer the stream
stays open and quiet, and picks up where it was once Redis is back.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, g, request

from tasks.jobs.model.models import FINISHED_STATES, JobRecord
from tasks.jobs.observe import events
from tasks.jobs.observe.queries import get_owned
from tasks.platform import broker
from tasks.platform.builtins import BUILTIN_APPS
from web import stream_leases
from web.api import operation
from web.errors import RETRY_AFTER_S, ApiError
from web.serving import STOPPING, STREAM_SLOTS

log = logging.getLogger(__name__)
bp = Blueprint("events", __name__, url_prefix="/api/v1/reports")

TERMINAL_EVENTS = ("completed", "failed", "cancelled")
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
POLL_S = 0.2
KEEPALIVE_S = 15.0
# A job already finished whose terminal event is not in the stream (trimmed,
# or written a moment after the record) is waited for only this long.
FINISHED_GRACE_S = 2.0
REPORTS_QUEUE = BUILTIN_APPS["reports"].queue  # this module's routes are the reports app's
# A Redis stream id is two unsigned 64-bit integers, ``<ms>-<seq>`` (``-<seq>`` optional);
# ASCII digits only (``\d`` would take Arabic-Indic digits, which Redis refuses).
STREAM_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")
STREAM_ID_MAX = 2**64 - 1
TIMEOUT = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")


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
    client_gone: Callable[[], bool] = lambda: False
    stopping: threading.Event = field(default_factory=threading.Event)
    renew: Callable[[], None] = lambda: None  # keeps the stream's lease (web.stream_leases)

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
        """This job's events after the cursor; none while Redis does not answer."""
        if broker.unreachable():
            return
        started = time.monotonic()
        try:
            found = list(events.read([self.queue], since=self.cursor))
        except broker.UNREACHABLE_ERRORS as exc:
            broker.failed(exc, started)
            log.info("event stream of job %s: Redis unavailable (%s)", self.job_id, exc)
            return
        for event in found:
            self.cursor = event["id"]
            if event.get("jobId") == self.job_id:
                yield event

    def _open(self) -> bool:
        return not (self.stopping.is_set() or self.client_gone())

    def _follow(self) -> Iterator[str]:
        quiet_since = time.monotonic()
        while time.monotonic() < self.deadline and self._open():
            for event in self._new_events():
                quiet_since = time.monotonic()
                yield sse(event)
                if event["event"] in TERMINAL_EVENTS:
                    return
            self.renew()
            if time.monotonic() - quiet_since >= KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keep-alive\n\n"  # lets proxies and clients see the stream is alive
            time.sleep(min(POLL_S, max(0.0, self.deadline - time.monotonic())))


def timeout_s() -> float:
    raw = request.args.get("timeout")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    # ASCII digits only: float() also reads Arabic-Indic digits, "nan" and "1e3"
    value = float(raw) if TIMEOUT.fullmatch(raw) else -1.0
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ApiError(
            400,
            f"timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]",
            code="validation_failed",
            details=[{"field": "timeout", "message": "out of range", "type": "value_error"}],
        )
    return value


def client_gone_probe(environ: dict[str, Any]) -> Callable[[], bool]:
    """``gone()``: whether the client closed the connection this response is written to.

    An event stream only writes, so a closed connection would otherwise be
    noticed at the next write that fails — a keep-alive up to 15 s later, and
    the write after that. Peeking at the socket sees the client's FIN at once:
    it reads as end-of-file, while a live client has sent nothing more.
    """
    sock = environ.get("gunicorn.socket")
    if sock is None:  # another server (flask run, the test client): rely on failed writes
        return lambda: False

    def gone() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False  # nothing to read: still connected
        except ValueError:
            return False  # TLS sockets cannot peek: rely on failed writes
        except OSError:
            return True  # reset by the peer

    return gone


def _take_stream_slot(environ: dict[str, Any]) -> threading.BoundedSemaphore | None:
    """Reserve one of this process's stream threads, or refuse with 503 (``web.serving``)."""
    slots = environ.get(STREAM_SLOTS)
    if slots is None:
        return None
    if not slots.acquire(blocking=False):
        raise ApiError(
            503,
            "too many open event streams on this server, try again shortly",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return slots


def _resume_after() -> str:
    """Where to start: after ``Last-Event-ID`` if the client sent one, else the beginning.

    An id that is no Redis stream id is refused (400) here, before the stream
    starts: Redis would refuse it only once the 200 is on its way.
    """
    last = request.headers.get("Last-Event-ID", "").strip()
    if not last:
        return "0"
    if not is_stream_id(last):
        raise bad_last_event_id(
            "Last-Event-ID is not an event id",
            "stream_id",
            "an id this stream sent: <ms>-<seq>, each 0..2^64-1",
        )
    return last


def is_stream_id(text: str) -> bool:
    """Whether ``text`` is a Redis stream id (``<ms>-<seq>``, each below 2^64)."""
    found = STREAM_ID.fullmatch(text)
    return found is not None and all(
        int(part) <= STREAM_ID_MAX for part in found.groups() if part is not None
    )


def bad_last_event_id(message: str, kind: str, expected: str) -> ApiError:
    """The 400 of a ``Last-Event-ID`` that the stream cannot have sent."""
    return ApiError(
        400,
        message,
        code="validation_failed",
        details=[{"field": "Last-Event-ID", "type": kind, "message": expected}],
    )


@operation(
    bp,
    "/jobs/<job_id>/events",
    "GET",
    summary="A report job's events as Server-Sent Events (replayed, then live); "
    "ends after completed/failed/cancelled or ?timeout= seconds (default 30, max 300); "
    "503 when the server has no room for another stream, or the caller's user or tenant "
    "already holds its share of open streams (KEEL_STREAMS_PER_USER, KEEL_STREAMS_PER_TENANT)",
    responses={200: None, 400: None, 401: None, 404: None, 503: None},
    produces="text/event-stream",
)
def job_events(job_id: str):
    timeout = timeout_s()
    principal = g.principal
    job = get_owned(job_id, principal.owner, queue=REPORTS_QUEUE, tenant_wide=principal.operator)
    return stream_response(job, timeout)


def stream_response(job: JobRecord, timeout_s: float) -> Response:
    """``job``'s events as a ``text/event-stream`` response (the caller checked who may see it)."""
    cursor = _resume_after()
    return open_stream(
        lambda held: JobEventStream(
            job_id=job.id,
            queue=job.queue,
            cursor=cursor,
            deadline=time.monotonic() + timeout_s,
            finished=job.state in FINISHED_STATES,
            client_gone=held.client_gone,
            stopping=held.stopping,
            renew=held.renew,
        )
    )


@dataclass
class Held:
    """What an open stream holds and watches: whether its client left, whether the server
    is stopping, and its lease to renew (``web.stream_leases``)."""

    client_gone: Callable[[], bool]
    stopping: threading.Event
    renew: Callable[[], None]


def open_stream(body: Callable[[Held], Iterable[str]]) -> Response:
    """A ``text/event-stream`` response of ``body``, in one of this server's stream slots and
    within the caller's share of open streams (503 past either), both let go when it ends."""
    environ = request.environ
    principal = g.principal
    slot = _take_stream_slot(environ)
    try:
        lease = stream_leases.take(principal.tenant_id, principal.user_id)
    except ApiError:
        if slot is not None:
            slot.release()
        raise
    held = Held(
        client_gone=client_gone_probe(environ),
        stopping=environ.get(STOPPING) or threading.Event(),
        renew=lease.renew if lease is not None else lambda: None,
    )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    response = Response(iter(body(held)), mimetype="text/event-stream", headers=headers)
    # the server closes every response it started
    if slot is not None:
        response.call_on_close(slot.release)
    if lease is not None:
        response.call_on_close(lease.release)
    return response
