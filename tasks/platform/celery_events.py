"""Celery's task and worker events: a bounded retry when the broker is gone, and
the worker's task events sent in batches.

Celery retries a worker heartbeat event forever by default (kombu's ensure
with no ``max_retries``). When Redis dies with the rest of a stack, a worker
in its cold shutdown then waits on that retry, holding the event dispatcher's
lock, and never exits. Events are telemetry (Flower's live view): a few quick
retries, then the event is dropped — the job records are the truth.

Wired with ``Celery(events=...)`` in ``tasks.celery``: the app's Events class
names this dispatcher.

A worker sends three task events per job (received, started, and how it
ended). Celery buffers them and flushes the buffer on the event loop's next
turn, so under load nearly every event is a ``PUBLISH`` and a wait for its
reply in the worker's main process — the one process every delivery goes
through. ``BatchedTaskEvents`` flushes at most every ``KEEL_EVENT_FLUSH_S``
(50 ms) instead (or at once when Celery's buffer of 24 is full), as one ``task.multi``
message that Flower and ``celery events`` read like single events. Events are
at most that much later; at shutdown the buffer is flushed before the
connection closes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher

from tasks.platform.config import get_settings

log = logging.getLogger(__name__)

RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


class BoundedEventDispatcher(EventDispatcher):
    """Celery's dispatcher; an event sent with ``retry`` and no policy gets ``RETRY_POLICY``."""

    def send(
        self,
        type: str,
        *args: Any,
        retry: bool = False,
        retry_policy: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Any:
        if retry and retry_policy is None:
            retry_policy = RETRY_POLICY
        return super().send(type, *args, retry=retry, retry_policy=retry_policy, **fields)


class KeelEvents(Events):
    """The app's events, sent through ``BoundedEventDispatcher``."""

    dispatcher_cls = "tasks.platform.celery_events:BoundedEventDispatcher"


class BatchedTaskEvents:
    """Worker consumer mixin: the buffered task events leave every ``KEEL_EVENT_FLUSH_S``."""

    hub: Any
    _events_flush_at: float | None = None

    def on_send_event_buffered(self) -> None:
        """Celery's hook for a buffered event: schedule one flush, not one per event."""
        if self.hub is None:
            return
        wait_s = get_settings().event_flush_s
        now = time.monotonic()
        # A flush scheduled long ago and never run (its timer went with a reset hub) is
        # scheduled again rather than waited for.
        if self._events_flush_at is not None and now < self._events_flush_at + 10 * wait_s:
            return
        self._events_flush_at = now + wait_s
        self.hub.call_later(wait_s, self._flush_batched_events)

    def _flush_batched_events(self) -> None:
        self._events_flush_at = None
        self._flush_events()  # type: ignore[attr-defined]

    def shutdown(self) -> None:
        """Flush what is buffered before Celery closes the event connection."""
        try:
            self._flush_events()  # type: ignore[attr-defined]
        except Exception as exc:  # events are for watching; shutdown goes on
            log.debug("could not flush task events at shutdown: %s", exc)
        super().shutdown()  # type: ignore[misc]
