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


# Between an event and its job's name in a counter's field (a name never holds it).
NAME_SEPARATOR = "\x1f"


def count_event(
    pipe: Any, queue: str, event: str, n: int = 1, *, job_name: str | None = None
) -> None:
    """Add to a pipeline (the event's own XADD): ``n`` more ``event`` of ``job_name``'s jobs
    on ``queue``."""
    field = f"{event}{NAME_SEPARATOR}{job_name}" if job_name else event
    pipe.hincrby(events_key(queue), field, n)


def event_field(field: str) -> tuple[str, str]:
    """``(event, job name)`` of a counter's field; ``""`` for events counted without a name
    (and by releases before names were counted)."""
    event, _, job_name = field.partition(NAME_SEPARATOR)
    return event, job_name


def _named(field: str, job_name: str | None) -> str:
    return f"{field}{NAME_SEPARATOR}{job_name}" if job_name else field


def add_observation(
    pipe: Any, queue: str, kind: str, seconds: float, job_name: str | None = None
) -> None:
    """Add to a pipeline: one observation of a run of ``job_name``: its ``duration`` or its
    ``wait``. The histogram's fields are its bucket, ``sum`` and ``count``, each with the
    job's name as a counter's field has it."""
    key = histogram_key(queue, kind)
    pipe.hincrby(key, _named(bucket_of(seconds), job_name), 1)
    pipe.hincrbyfloat(key, _named("sum", job_name), seconds)
    pipe.hincrby(key, _named("count", job_name), 1)


def observe(queue: str, kind: str, seconds: float, job_name: str | None = None) -> None:
    """One observation of a run's ``duration`` or its ``wait`` before starting, on its own
    (a transition's event carries its observation in the same round trip: ``events.emit``)."""
    try:
        pipe = redis_client().pipeline(transaction=False)
        add_observation(pipe, queue, kind, seconds, job_name)
        pipe.execute()
    except Exception:  # metrics must never break a job
        log.debug("could not record %s for %s", kind, queue, exc_info=True)


def snapshot(queues: list[str]) -> dict[str, Any]:
    """Everything recorded for ``queues``: event counts by ``(event, job name)``, histograms
    by job name (``""``: observations made before names were recorded) and field."""
    client = redis_client()
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.hgetall(events_key(queue))
        for kind in HISTOGRAMS:
            pipe.hgetall(histogram_key(queue, kind))
    raw = iter(pipe.execute())
    found: dict[str, Any] = {}
    for queue in queues:
        counts = {event_field(k.decode()): int(v) for k, v in next(raw).items()}
        histograms: dict[str, dict[str, dict[str, float]]] = {}
        for kind in HISTOGRAMS:
            by_name: dict[str, dict[str, float]] = {}
            for key, value in next(raw).items():
                field, job_name = event_field(key.decode())
                by_name.setdefault(job_name, {})[field] = float(value)
            histograms[kind] = by_name
        found[queue] = {"events": counts, **histograms}
    return found
