"""The API's request durations by method, route template and status, from every web process.

gunicorn serves the API from several processes (``KEEL_WEB_WORKERS``), and several hosts
may serve it, while a scrape reaches one of them: a process's own Prometheus histogram
would show a sliver. So each process counts its requests in memory (``observe``) and adds
them to one Redis hash every ``FLUSH_S`` seconds, once each (``tasks.platform.tallies``: what a
kill loses, what a lost reply does); ``/metrics`` reads the hash (``web.system``), as it
reads the job metrics.

The labels are bounded: the route is the URL rule's template (``/api/v1/jobs/<job_id>``;
``<unmatched>`` for a path no rule matches), never the path.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from tasks.platform.broker import redis_client
from tasks.platform.tallies import Tally

KEY = "keel:metrics:http"
# Each process's last flush number added (a field per process; removed at a graceful exit).
APPLIED_KEY = "keel:metrics:http:applied"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FLUSH_S = 5.0
SEPARATOR = "\x1f"  # between the labels of a field (none of them holds it)


METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """A client may send any method name: the label keeps to the known ones, else OTHER."""
    return method if method in METHODS else "OTHER"


def field(method: str, route: str, status: int, part: str) -> str:
    """A hash field: the request's labels, then a bucket's bound, ``sum`` or ``count``."""
    return SEPARATOR.join((method, route, str(status), part))


def parse(name: str) -> tuple[tuple[str, str, str], str]:
    """``((method, route, status), part)`` of a hash field."""
    method, route, status, part = name.split(SEPARATOR)
    return (method, route, status), part


class Recorder(Tally):
    """This process's request counts (``tasks.platform.tallies``)."""

    def __init__(self) -> None:
        super().__init__(APPLIED_KEY, FLUSH_S, "keel-http-metrics")

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        bucket = next((str(b) for b in BUCKETS if seconds <= b), "+Inf")
        self.add(KEY, field(method, route, status, bucket))
        self.add(KEY, field(method, route, status, "count"))
        self.add_float(KEY, field(method, route, status, "sum"), seconds)


RECORDER = Recorder()
os.register_at_fork(after_in_child=RECORDER.forget)
atexit.register(RECORDER.close)  # a gunicorn worker's graceful exit keeps its last counts


def observe(method: str, route: str, status: int, seconds: float) -> None:
    RECORDER.observe(method, route, status, seconds)


def snapshot() -> dict[tuple[str, str, str], dict[str, float]]:
    """Every process's flushed counts: by ``(method, route, status)``, each bucket's count
    (not cumulative), ``sum`` and ``count``."""
    found: dict[tuple[str, str, str], dict[str, float]] = {}
    raw: dict[Any, Any] = redis_client().hgetall(KEY)
    for name, value in raw.items():
        labels, part = parse(name.decode())
        found.setdefault(labels, {})[part] = float(value)
    return found
