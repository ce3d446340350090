"""The API's request durations by method, route template and status, from every web process.

gunicorn serves the API from several processes (``KEEL_WEB_WORKERS``), and several hosts
may serve it, while a scrape reaches one of them: a process's own Prometheus histogram
would show a sliver. So each process counts its requests in memory (a lock and three
dict updates per request, ``observe``) and adds them to one Redis hash every
``FLUSH_S`` seconds from a thread of its own; ``/metrics`` reads the hash
(``web.system``), as it reads the job metrics. A process killed loses at most its last
``FLUSH_S`` seconds of counts; while Redis is away, the counts wait in memory.

A flush counts once, even when it is sent twice: each is numbered (per process), and one
script adds its counts and records its number, or does nothing for a number it has
recorded already. So a flush whose reply was lost (a timeout after Redis had applied
it) is sent again, under its number, and not counted a second time; counts observed
meanwhile wait for the next number.

The labels are bounded: the route is the URL rule's template (``/api/v1/jobs/<job_id>``;
``<unmatched>`` for a path no rule matches), never the path.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from tasks.broker import redis_client

log = logging.getLogger(__name__)

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


# KEYS: the counts, the flush numbers. ARGV: the process, its flush's number, then field and
# value pairs (a ``sum`` field is a float).
_APPLY = r"""
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) <= last then return 0 end
for i = 3, #ARGV, 2 do
  if string.sub(ARGV[i], -4) == '\31sum' then
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  else
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""


def _process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Recorder:
    """This process's counts: those observed since the last flush (``_pending``), and the
    flush sent but not known to be added (``_unsent``: its number and counts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}
        self._unsent: tuple[int, dict[str, float]] | None = None
        self._number = 0
        self._process = _process_name()
        self._flusher: threading.Thread | None = None

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        bucket = next((str(b) for b in BUCKETS if seconds <= b), "+Inf")
        keys = (field(method, route, status, bucket), field(method, route, status, "count"))
        total = field(method, route, status, "sum")
        with self._lock:
            pending = self._pending
            for key in keys:
                pending[key] = pending.get(key, 0) + 1
            pending[total] = pending.get(total, 0.0) + seconds
            if self._flusher is None:
                self._start()

    def flush(self) -> bool:
        """Add the counts to Redis; ``False`` (and kept, under their number) if it failed."""
        for _ in range(2):  # the flush that failed before, then what came since
            with self._lock:
                if self._unsent is None:
                    if not self._pending:
                        return True
                    self._number += 1
                    self._unsent, self._pending = (self._number, self._pending), {}
                number, counts = self._unsent
            try:
                args: list[Any] = [self._process, number]
                for name, value in counts.items():
                    args += [name, value if name.endswith(SEPARATOR + "sum") else int(value)]
                redis_client().eval(_APPLY, 2, KEY, APPLIED_KEY, *args)
            except Exception:
                log.debug("request metrics not flushed; kept for the next flush", exc_info=True)
                return False
            with self._lock:
                if self._unsent is not None and self._unsent[0] == number:
                    self._unsent = None
        return True

    def close(self) -> None:
        """At a graceful exit: the last counts, and this process's flush number forgotten."""
        if self.flush():
            try:
                redis_client().hdel(APPLIED_KEY, self._process)
            except Exception:
                log.debug("request metrics: flush number not removed", exc_info=True)

    def _start(self) -> None:
        self._flusher = threading.Thread(target=self._loop, name="keel-http-metrics", daemon=True)
        self._flusher.start()

    def _loop(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush()

    def forget(self) -> None:
        """In a forked child: the parent's counts are the parent's, and so is its thread."""
        self._lock = threading.Lock()
        self._pending = {}
        self._unsent = None
        self._number = 0
        self._process = _process_name()
        self._flusher = None


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
