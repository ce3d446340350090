"""Job metrics shared by every process, kept in Redis hashes.

Workers run jobs in many processes (prefork children, several hosts) while
``/metrics`` is served by the web app, so in-process Prometheus counters
would each see a sliver. Instead every event bumps a counter and every
finished run adds to a histogram, both in Redis hashes, and the web app's
collector (``web.system``) turns them into Prometheus families at scrape time.

A process adds its counts up in memory and sends them every ``FLUSH_S``
seconds in one round trip, each once (``tasks.platform.tallies``: a kill loses at most
that second's counts). Sent with each event, they were nine Redis commands of
a no-op job's twenty-four, the most of its Redis time.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from tasks.platform.broker import redis_client
from tasks.platform.tallies import Tally

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
FLUSH_S = 1.0
# Each process's last flush number added (a field per process; removed at a graceful exit).
APPLIED_KEY = "keel:metrics-applied:jobs"
TALLY = Tally(APPLIED_KEY, FLUSH_S, "keel-job-metrics")
os.register_at_fork(after_in_child=TALLY.forget)
atexit.register(TALLY.close)  # a prefork child has no atexit: tasks.celery closes it there


def flush() -> bool:
    """Send this process's counts now (they go every ``FLUSH_S`` seconds anyway)."""
    return TALLY.flush()


def count_event(queue: str, event: str, n: int = 1, *, job_name: str | None = None) -> None:
    """``n`` more ``event`` of ``job_name``'s jobs on ``queue``."""
    field = f"{event}{NAME_SEPARATOR}{job_name}" if job_name else event
    TALLY.add(events_key(queue), field, n)


def event_field(field: str) -> tuple[str, str]:
    """``(event, job name)`` of a counter's field; ``""`` for events counted without a name
    (and by releases before names were counted)."""
    event, _, job_name = field.partition(NAME_SEPARATOR)
    return event, job_name


def _named(field: str, job_name: str | None) -> str:
    return f"{field}{NAME_SEPARATOR}{job_name}" if job_name else field


def observe(queue: str, kind: str, seconds: float, job_name: str | None = None) -> None:
    """One observation of a run of ``job_name``: its ``duration`` or its ``wait`` before
    starting. The histogram's fields are its bucket, ``sum`` and ``count``, each with the
    job's name as a counter's field has it."""
    key = histogram_key(queue, kind)
    TALLY.add(key, _named(bucket_of(seconds), job_name))
    TALLY.add_float(key, _named("sum", job_name), seconds)
    TALLY.add(key, _named("count", job_name))


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
