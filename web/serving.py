"""The gunicorn worker that serves Keel's API (``worker_class`` in ``web.gunicorn_conf``).

Why threads (gunicorn's ``gthread``), not sync or gevent workers: a sync
worker serves one request at a time, so each open event stream
(``…/events``, up to five minutes) took a whole worker and two of them
stopped the API; its heartbeat also waits for the request, so gunicorn's
``timeout`` cut long streams. A ``gthread`` worker gives each connection a
thread from a pool and beats from its main loop: a stream costs one mostly
sleeping thread and lasts as long as it should. gevent would make a stream
cheaper still, but it needs monkey-patching under psycopg, redis-py, kombu
and Celery's producer, and any call that blocks in C stalls every request of
the process — the database deadlines (``tasks.deadline``) are written for
plain threads.

What this class adds to ``gthread``:

- **Threads kept for requests.** At most ``threads - REQUEST_THREADS``
  responses of a process may be long-lived streams at once (the semaphore
  in ``environ[STREAM_SLOTS]``); the rest of the pool is kept for ordinary
  requests, so however many clients open a stream, requests still get a
  thread. A stream over the limit is refused with 503 and ``Retry-After``.
- **A deadline on reading a request's head.** ``gthread`` waits for a new
  connection's first bytes without a thread, but then a thread reads the
  rest of the head as slowly as the client sends it. A connection whose
  head is not complete ``HEAD_TIMEOUT_S`` after a thread took it is shut
  down, so a slow client cannot hold a thread. (Many thousands of them are
  a job for a buffering proxy in front, as gunicorn's documentation says.)
- **Streams end on a graceful stop.** On SIGTERM ``environ[STOPPING]`` is
  set and open streams finish at once (clients reconnect with
  ``Last-Event-ID``) instead of holding the stop for ``graceful_timeout``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from gunicorn.workers.gthread import ThreadWorker

STREAM_SLOTS = "keel.stream_slots"
STOPPING = "keel.stopping"
REQUEST_THREADS = 32
HEAD_TIMEOUT_S = 10.0


class StreamingWorker(ThreadWorker):
    """``gthread`` with threads kept for requests and a deadline on request heads."""

    def init_process(self) -> None:
        self._heads: dict[Any, float] = {}  # connection → when its head must be in
        self._heads_lock = threading.Lock()
        self._stopping = threading.Event()
        slots = max(1, self.cfg.threads - REQUEST_THREADS)
        self._environ = {STREAM_SLOTS: threading.BoundedSemaphore(slots), STOPPING: self._stopping}
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        app: Any = cast(Any, self).wsgi  # gunicorn's attribute, untyped
        extra = self._environ

        def with_serving_state(environ: dict, start_response: Callable) -> Iterable[bytes]:
            environ.update(extra)
            return app(environ, start_response)

        self.wsgi = with_serving_state

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self._stopping.is_set():
            self.log.info("stopping: open event streams end now")
            self._stopping.set()
        super().handle_exit(sig, frame)

    def handle(self, conn: Any) -> Any:
        with self._heads_lock:
            self._heads[conn] = time.monotonic() + HEAD_TIMEOUT_S
        try:
            return super().handle(conn)
        finally:
            self._forget_head(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        self._forget_head(conn)  # the head is in: from here on the time is the application's
        return super().handle_request(req, conn)

    def murder_keepalived(self, *args: Any, **kwargs: Any) -> None:
        """Called by the main loop at least once a second: also cut heads past their deadline."""
        super().murder_keepalived(*args, **kwargs)
        now = time.monotonic()
        with self._heads_lock:
            late = [conn for conn, deadline in self._heads.items() if deadline <= now]
            for conn in late:
                del self._heads[conn]
        for conn in late:
            self.log.info(
                "closing %s: request head not received within %.0f s", conn.client, HEAD_TIMEOUT_S
            )
            with contextlib.suppress(OSError):  # the reading thread sees EOF and lets go
                conn.sock.shutdown(socket.SHUT_RDWR)

    def _forget_head(self, conn: Any) -> None:
        with self._heads_lock:
            self._heads.pop(conn, None)
