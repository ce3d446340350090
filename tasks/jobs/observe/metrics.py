"""Job metrics shared by every process, kept in Redis hashes.

Workers run jobs in many processes (prefork children, several hosts) while
``/metrics`` is served by the web app, so in-process Prometheus counters
would each see a sliver. Instead every event bumps a counter and every
finished run adds to a histogram, both in Redis, and the web app's collector
(``web.system``) turns them into Prometheus families at scrape time.
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.broker import redis_client

log = logging.getLogger(__name__)
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
HISTOGRAMS = ("duration", "wait")


def events_key(queue: str) -> str:
    return f"keel:metrics:{queue}:events"


def histogram_key(queue: str, kind: str) -> str:
    return f"keel:metrics:{queue}:{kind}"


def bucket_of(seconds: float) -> str:
    return next((str(b) for b in BUCKETS if seconds <= b), "+Inf")


def count_event(pipe: Any, queue: str, event: str, n: int = 1) -> None:
    """Add to a pipeline (the event's own XADD): ``n`` more ``event`` on ``queue``."""
    pipe.hincrby(events_key(queue), event, n)


def add_observation(pipe: Any, queue: str, kind: str, seconds: float) -> None:
    """Add to a pipeline: one observation of a run's ``duration`` or its ``wait``."""
    key = histogram_key(queue, kind)
    pipe.hincrby(key, bucket_of(seconds), 1)
    pipe.hincrbyfloat(key, "sum", seconds)
    pipe.hincrby(key, "count", 1)


def observe(queue: str, kind: str, seconds: float) -> None:
    """One observation of a run's ``duration`` or its ``wait`` before starting, on its own
    (a transition's event carries its observation in the same round trip: ``events.emit``)."""
    try:
        pipe = redis_client().pipeline(transaction=False)
        add_observation(pipe, queue, kind, seconds)
        pipe.execute()
    except Exception:  # metrics must never break a job
        log.debug("could not record %s for %s", kind, queue, exc_info=True)


def snapshot(queues: list[str]) -> dict[str, Any]:
    """Everything recorded for ``queues``: event counts and histograms."""
    client = redis_client()
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.hgetall(events_key(queue))
        for kind in HISTOGRAMS:
            pipe.hgetall(histogram_key(queue, kind))
    raw = iter(pipe.execute())
    found: dict[str, Any] = {}
    for queue in queues:
        counts = {k.decode(): int(v) for k, v in next(raw).items()}
        histograms = {
            kind: {k.decode(): float(v) for k, v in next(raw).items()} for kind in HISTOGRAMS
        }
        found[queue] = {"events": counts, **histograms}
    return found
