"""Celery's task and worker events, with a bounded retry when the broker is gone.

Celery retries a worker heartbeat event forever by default (kombu's ensure
with no ``max_retries``). When Redis dies with the rest of a stack, a worker
in its cold shutdown then waits on that retry, holding the event dispatcher's
lock, and never exits. Events are telemetry (Flower's live view): a few quick
retries, then the event is dropped — the job records are the truth.

Wired with ``Celery(events=...)`` in ``tasks.celery``: the app's Events class
names this dispatcher.
"""

from __future__ import annotations

from typing import Any

from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher

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

    dispatcher_cls = "tasks.celery_events:BoundedEventDispatcher"
