"""``GET /api/v1/events``: the events of every job of the caller's tenant, as Server-Sent
Events (operators), for an integrator that follows a tenant's work without polling.

One stream over the queues asked for (``?queue=``, by default every queue a job type runs
on), of the tenant's jobs only, narrowed if asked to event names (``?event=completed,
failed``) and job names (``?name=``). It sends what happens from the moment it opens (as
BullMQ's ``QueueEvents`` does), each event with the same fields as a job's own stream
(``web.events``), until ``?timeout=`` seconds have passed (default 30, at most 300).

Each event's id is the stream's position in every queue it reads
(``default=1733580000000-0&reports=1733579990000-3``), so a client that reconnects with
``Last-Event-ID`` resumes exactly after the last event it got: nothing in between is lost
or sent twice, as long as each queue's stream still holds it (its last ~10,000 events,
``tasks.jobs.observe.events``). The position also goes out without an event, when the
stream opens and with every keep-alive, so a client whose tenant was quiet resumes from
there, not from the start again. Caps, slots and a stopping server: as a job's stream.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from flask import Blueprint, g, request
from pydantic import BaseModel, ConfigDict, Field

from tasks.jobs.calls.loading import known_queues
from tasks.jobs.observe import events
from tasks.platform import broker
from web.api import operation
from web.auth import OPERATOR
from web.errors import RETRY_AFTER_S, ApiError
from web.events import (
    KEEPALIVE_S,
    POLL_S,
    TIMEOUT,
    Held,
    bad_last_event_id,
    is_stream_id,
    open_stream,
    sse,
    timeout_s,
)

log = logging.getLogger(__name__)
bp = Blueprint("tenant_events", __name__, url_prefix="/api/v1/events")

MAX_NAMES = 50  # job names in one ?name=
LIST = r"^[^\x00-\x1f\x7f]{1,4000}$"  # a comma-separated list, on one line
_EVENT = "|".join(re.escape(name) for name in events.EVENT_NAMES)
EVENT_LIST = rf"^(?:{_EVENT})(?:,(?:{_EVENT}))*$"
_NAME = r"[^,\x00-\x1f\x7f]{1,200}"
NAME_LIST = rf"^{_NAME}(?:,{_NAME}){{0,{MAX_NAMES - 1}}}$"


class TenantEventsQuery(BaseModel):
    """What ``GET /api/v1/events`` follows."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(
        default=None, pattern=LIST, description="queues, comma-separated (default: every queue)"
    )
    event: str | None = Field(
        default=None,
        pattern=EVENT_LIST,
        description=f"event names, comma-separated: some of {', '.join(events.EVENT_NAMES)}",
    )
    name: str | None = Field(
        default=None,
        pattern=NAME_LIST,
        description=f"job names, comma-separated (at most {MAX_NAMES})",
    )
    timeout: str | None = Field(
        default=None,
        pattern=f"^{TIMEOUT.pattern}$",
        description="seconds the stream stays open, (0, 300]; default 30",
    )


def _refused(field: str, message: str) -> ApiError:
    return ApiError(
        400,
        message,
        code="validation_failed",
        details=[{"field": field, "message": message, "type": "value_error"}],
    )


def _listed(raw: str | None) -> list[str]:
    return [part.strip() for part in (raw or "").split(",") if part.strip()]


def _queues(raw: str | None) -> list[str]:
    known = known_queues()
    asked = _listed(raw) or known
    unknown = sorted(set(asked) - set(known))
    if unknown:
        raise _refused("queue", f"no job type runs on queue {unknown[0]!r}")
    return sorted(set(asked))


def _events(raw: str | None) -> frozenset[str]:
    asked = _listed(raw)
    unknown = sorted(set(asked) - set(events.EVENT_NAMES))
    if unknown:
        raise _refused("event", f"{unknown[0]!r} is not an event: {', '.join(events.EVENT_NAMES)}")
    return frozenset(asked)


def _names(raw: str | None) -> frozenset[str]:
    asked = _listed(raw)
    if len(asked) > MAX_NAMES:
        raise _refused("name", f"at most {MAX_NAMES} job names")
    return frozenset(asked)


def position(cursors: dict[str, str]) -> str:
    """The stream's position in every queue it reads, as an event id."""
    return urlencode(sorted(cursors.items()))


def _resume_from(queues: list[str]) -> dict[str, str] | None:
    """Each queue's cursor from ``Last-Event-ID`` (``None``: no id sent, start from now); a
    queue the id does not name starts from now too. An id this stream cannot have sent is
    400, before the stream starts."""
    last = request.headers.get("Last-Event-ID", "").strip()
    if not last:
        return None
    try:
        pairs = parse_qsl(last, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        pairs = [("", "")]
    cursors = dict(pairs)
    if not all(is_stream_id(at) for _, at in pairs):
        raise bad_last_event_id(
            "Last-Event-ID is not an id of this stream",
            "stream_position",
            "an id this stream sent: <queue>=<ms>-<seq>&…",
        )
    missing = [queue for queue in queues if queue not in cursors]
    now = events.latest_ids(missing) if missing else {}
    return {queue: cursors.get(queue) or now[queue] for queue in queues}


@dataclass
class TenantEventStream:
    """Follows the queues' streams from ``cursors``, sending the tenant's events that pass
    the filters, each with the position after it."""

    tenant_id: str
    cursors: dict[str, str]
    wanted_events: frozenset[str]
    wanted_names: frozenset[str]
    deadline: float
    held: Held

    def __iter__(self) -> Iterator[str]:
        yield f"id: {position(self.cursors)}\n\n"  # where to resume, should nothing come
        quiet_since = time.monotonic()
        while time.monotonic() < self.deadline and self._open():
            for queue, event in self._new_events():
                self.cursors[queue] = event["id"]
                if self._wanted(event):
                    quiet_since = time.monotonic()
                    yield sse({**event, "id": position(self.cursors)})
            self.held.renew()
            if time.monotonic() - quiet_since >= KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield f": keep-alive\nid: {position(self.cursors)}\n\n"
            time.sleep(min(POLL_S, max(0.0, self.deadline - time.monotonic())))

    def _open(self) -> bool:
        return not (self.held.stopping.is_set() or self.held.client_gone())

    def _wanted(self, event: dict[str, Any]) -> bool:
        return (
            event.get("tenant") == self.tenant_id
            and (not self.wanted_events or event.get("event") in self.wanted_events)
            and (not self.wanted_names or event.get("name") in self.wanted_names)
        )

    def _new_events(self) -> list[tuple[str, dict[str, Any]]]:
        """Every queue's events after its cursor; none while Redis does not answer."""
        if broker.unreachable():
            return []
        started = time.monotonic()
        try:
            return events.read_after(self.cursors)
        except broker.UNREACHABLE_ERRORS as exc:
            broker.failed(exc, started)
            log.info("event stream of tenant %s: Redis unavailable (%s)", self.tenant_id, exc)
            return []


@operation(
    bp,
    "",
    "GET",
    summary="Operator: the events of every job of the tenant as Server-Sent Events, from now "
    "on (Last-Event-ID resumes exactly), on the queues asked for (?queue=, default every "
    "queue), narrowed to event names (?event=) and job names (?name=); open ?timeout= seconds "
    "(default 30, max 300); 503 when the server has no room for another stream, or the "
    "caller's user or tenant already holds its share of open streams",
    query=TenantEventsQuery,
    role=OPERATOR,
    responses={200: None, 400: None, 401: None, 403: None, 503: None},
    produces="text/event-stream",
)
def tenant_events(query: TenantEventsQuery):
    queues = _queues(query.queue)
    wanted_events, wanted_names = _events(query.event), _names(query.name)
    timeout = timeout_s()
    try:
        cursors = _resume_from(queues) or events.latest_ids(queues)
    except broker.UNREACHABLE_ERRORS:
        raise ApiError(
            503,
            "events are unavailable while Redis does not answer, try again shortly",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    tenant_id = g.principal.tenant_id
    return open_stream(
        lambda held: TenantEventStream(
            tenant_id=tenant_id,
            cursors=dict(cursors),
            wanted_events=wanted_events,
            wanted_names=wanted_names,
            deadline=time.monotonic() + timeout,
            held=held,
        )
    )
