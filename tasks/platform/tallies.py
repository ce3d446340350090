"""Counts kept in a process's memory and added to Redis hashes every few seconds, once each.

Every process of Keel (a worker's pool processes, gunicorn's workers, a script that adds
jobs) counts what it does: job events and run times (``tasks.jobs.observe.metrics``), API
requests (``web.http_metrics``). Sending each count as it happens would cost Redis more
than the job itself (nine commands a no-op job, once); so a process adds them up in
memory (a lock and a few dict updates) and a thread of its own adds them to Redis every
``flush_s`` seconds, in one round trip whatever their number. ``/metrics`` reads the
hashes, so a scrape of any process sees every process's counts.

**What is lost.** A process killed loses at most its last ``flush_s`` seconds of counts;
a graceful exit (``close``: ``atexit``, Celery's ``worker_process_shutdown``) sends them,
if Redis answers then.
While Redis is away the counts wait in memory (their fields are bounded by the labels:
queue, event, job name, route), and go with the next flush that arrives.

**Once.** A flush counts once, even when it is sent twice: each is numbered (per
process), and one script adds its counts and records its number, or does nothing for a
number it has recorded already. So a flush whose reply was lost (a timeout after Redis
had applied it) is sent again, under its number, and not counted a second time; counts
observed meanwhile wait for the next number. A process's number is forgotten at its
graceful exit; one killed leaves its field behind (a few bytes).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from tasks.platform.broker import redis_client

log = logging.getLogger(__name__)

# KEYS[1]: the flush numbers, KEYS[2..]: the hashes counted in. ARGV: the process, its
# flush's number, how many integer counts come first, then (hash, field, value) triples:
# the hash as its index among the hashes (0-based), the integer counts before the floats.
_APPLY = r"""
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) <= last then return 0 end
local ints = tonumber(ARGV[3])
local n = 0
for i = 4, #ARGV, 3 do
  local key = KEYS[tonumber(ARGV[i]) + 2]
  -- pcall: a key of another type fails its entry, not the flush (whose number must be
  -- recorded, or the entries before it would be added again at every retry)
  if n < ints then
    redis.pcall('HINCRBY', key, ARGV[i + 1], ARGV[i + 2])
  else
    redis.pcall('HINCRBYFLOAT', key, ARGV[i + 1], ARGV[i + 2])
  end
  n = n + 1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

Counts = dict[tuple[str, str], float]


def _process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Tally:
    """One process's counts: those added since the last flush (``_ints``, ``_floats``), and
    the flush sent but not known to be applied (``_unsent``: its number and counts)."""

    _lock: threading.Lock
    _sending: threading.Lock  # one flush in flight: a number is never sent twice at once
    _closed: bool
    _ints: Counts
    _floats: Counts
    _unsent: tuple[int, Counts, Counts] | None
    _number: int
    process: str
    _flusher: threading.Thread | None

    def __init__(self, applied_key: str, flush_s: float, name: str) -> None:
        self.applied_key, self.flush_s, self.name = applied_key, flush_s, name
        self.forget()

    def add(self, key: str, field: str, n: int = 1) -> None:
        """``n`` more in ``field`` of hash ``key`` (``HINCRBY``, at the next flush)."""
        with self._lock:
            self._ints[key, field] = self._ints.get((key, field), 0) + n
            if self._flusher is None:
                self._start()

    def add_float(self, key: str, field: str, value: float) -> None:
        """``value`` more in ``field`` of hash ``key`` (``HINCRBYFLOAT``)."""
        with self._lock:
            self._floats[key, field] = self._floats.get((key, field), 0.0) + value
            if self._flusher is None:
                self._start()

    def flush(self) -> bool:
        """Add the counts to Redis; ``False`` (and kept, under their number) if it failed."""
        with self._sending:
            return self._flush()

    def _flush(self) -> bool:
        for _ in range(2):  # the flush that failed before, then what came since
            with self._lock:
                if self._unsent is None:
                    if not self._ints and not self._floats:
                        return True
                    self._number += 1
                    self._unsent = (self._number, self._ints, self._floats)
                    self._ints, self._floats = {}, {}
                number, ints, floats = self._unsent
            try:
                redis_client().eval(_APPLY, *self._script_args(number, ints, floats))
            except Exception:
                log.debug("%s not flushed; kept for the next flush", self.name, exc_info=True)
                return False
            with self._lock:
                if self._unsent is not None and self._unsent[0] == number:
                    self._unsent = None
        return True

    def _script_args(self, number: int, ints: Counts, floats: Counts) -> list[Any]:
        hashes: dict[str, int] = {}
        entries: list[Any] = []
        for counts, kind in ((ints, int), (floats, float)):
            for (key, field), value in counts.items():
                entries += [hashes.setdefault(key, len(hashes)), field, kind(value)]
        keys = [self.applied_key, *hashes]
        return [len(keys), *keys, self.process, number, len(ints), *entries]

    def close(self) -> None:
        """At a graceful exit: the last counts, and this process's flush number forgotten.
        The thread sends nothing after (a number sent again once forgotten would count
        twice)."""
        with self._sending:
            self._closed = True
            if self._flush() and self._number:
                try:
                    redis_client().hdel(self.applied_key, self.process)
                except Exception:
                    log.debug("%s: flush number not removed", self.name, exc_info=True)

    def forget(self) -> None:
        """Start afresh; in a forked child: the parent's counts are the parent's, and so is
        its thread."""
        self._lock, self._sending, self._closed = threading.Lock(), threading.Lock(), False
        self._ints, self._floats, self._unsent = {}, {}, None
        self._number = 0
        self.process = _process_name()
        self._flusher = None

    def _start(self) -> None:
        self._flusher = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._flusher.start()

    def _loop(self) -> None:
        while not self._closed:
            time.sleep(self.flush_s)
            with self._sending:
                if not self._closed:
                    self._flush()
