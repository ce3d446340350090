"""Queue events in a bounded Redis stream per queue, readable from any process.

Names and fields follow BullMQ's QueueEvents: ``waiting, active, progress,
completed, failed, retrying, delayed, deduplicated, stalled``, plus
``cancelled`` (a job cancelled or revoked before it ran, ``tasks.jobs.cancel``) and
``dead-lettered`` (an unreadable broker item set aside, ``tasks.transport``). Emitting is
best effort: a job never fails because its event could not be written, and
while Redis is unreachable (``tasks.broker``) events are dropped at once
rather than each waiting for a timeout.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from tasks import broker
from tasks.broker import redis_client
from tasks.jobs import metrics

log = logging.getLogger(__name__)
STREAM_MAXLEN = 10_000
EVENT_NAMES = (
    "waiting",
    "active",
    "progress",
    "completed",
    "failed",
    "retrying",
    "delayed",
    "deduplicated",
    "stalled",
    "cancelled",
    "dead-lettered",
)


def stream_key(queue: str) -> str:
    return f"keel:events:{queue}"


def emit_many(entries: list[tuple[str, str, str, str | None]]) -> None:
    """``(queue, event, job id, name)`` of many jobs, in one round trip (a bulk add's)."""
    if not entries or broker.unreachable():
        return
    started = time.monotonic()
    try:
        pipe = redis_client().pipeline(transaction=False)
        for queue, event, job_id, name in entries:
            entry: dict[Any, Any] = {
                "event": event,
                "jobId": job_id,
                "queue": queue,
                "time": f"{time.time():.3f}",
                **({"name": name} if name else {}),
            }
            pipe.xadd(stream_key(queue), entry, maxlen=STREAM_MAXLEN, approximate=True)
            metrics.count_event(pipe, queue, event)
        pipe.execute()
    except broker.UNREACHABLE_ERRORS as exc:
        broker.failed(exc, started)
        log.warning("could not emit %d events: %s", len(entries), exc)
    except Exception:
        log.warning("could not emit %d events", len(entries), exc_info=True)


def emit(
    queue: str,
    event: str,
    job_id: str,
    name: str | None = None,
    *,
    observed: tuple[str, float] | None = None,
    **fields: Any,
) -> None:
    """One event, its counter and (``observed``: a ``(kind, seconds)`` histogram observation,
    ``tasks.jobs.metrics``) what the transition measured: one round trip."""
    # Typed loosely: redis-py's stubs want invariant dicts of their own unions.
    entry: dict[Any, Any] = {
        "event": event,
        "jobId": job_id,
        "queue": queue,
        "time": f"{time.time():.3f}",
    }
    if name:
        entry["name"] = name
    for key, value in fields.items():
        entry[key] = value if isinstance(value, str) else json.dumps(value, default=str)
    if broker.unreachable():
        log.info("Redis unreachable: event %s for job %s dropped", event, job_id)
        return
    started = time.monotonic()
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.xadd(stream_key(queue), entry, maxlen=STREAM_MAXLEN, approximate=True)
        metrics.count_event(pipe, queue, event)
        if observed is not None:
            metrics.add_observation(pipe, queue, *observed)
        pipe.execute()
    except broker.UNREACHABLE_ERRORS as exc:
        broker.failed(exc, started)
        log.warning("could not emit %s for job %s: %s", event, job_id, exc)
    except Exception:
        log.warning("could not emit %s for job %s", event, job_id, exc_info=True)


def _decode(fields: dict[bytes, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in fields.items():
        value = raw.decode()
        k = key.decode()
        if k in ("event", "jobId", "queue", "name", "time"):
            out[k] = value
            continue
        try:
            out[k] = json.loads(value)
        except ValueError:
            out[k] = value
    return out


def read(
    queues: list[str], *, since: str = "0", follow: bool = False, block_ms: int = 250
) -> Iterator[dict[str, Any]]:
    """Events of ``queues`` after id ``since`` (``$``: new ones only); forever if ``follow``.

    ``block_ms`` stays under the client's socket timeout (``tasks.broker``):
    a blocking read that outlasts it would look like a hung Redis.
    """
    cursors: dict[Any, Any] = {stream_key(q): since for q in queues}
    client = redis_client()
    while True:
        batch: Any = client.xread(cursors, block=block_ms if follow else None, count=500)
        if not batch and not follow:
            return
        for stream, entries in batch or []:
            for entry_id, fields in entries:
                cursors[stream.decode()] = entry_id.decode()
                yield {"id": entry_id.decode(), **_decode(fields)}
        if not follow and batch and all(len(e) < 500 for _, e in batch):
            return
