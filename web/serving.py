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
the process — the database deadlines (``tasks.platform.deadline``) are written for
plain threads.

What this class adds to ``gthread``:

- **Threads kept for requests.** At most ``threads - REQUEST_THREADS``
  responses of a process may be long-lived streams at once (the semaphore
  in ``environ[STREAM_SLOTS]``); the rest of the pool is kept for ordinary
  requests, so however many clients open a stream, requests still get a
  thread. A stream over the limit is refused with 503 and ``Retry-After``.
- **Request heads read without a thread.** ``gthread`` hands a new
  connection (and a kept-alive one that became readable) to a thread, which
  then waits for its first bytes and reads its head as slowly as the client
  sends it: a few hundred clients sending partial heads held every thread and
  stalled the API. Here the process's main loop reads heads itself, from
  non-blocking sockets as bytes arrive (``HeadReader``), and a connection
  reaches a thread only once its head is complete (its bytes handed to
  gunicorn's parser as if just read). A head not complete within
  ``HEAD_TIMEOUT_S`` is hung up on, and one address may keep at most
  ``HEADS_PER_ADDRESS`` incomplete heads per process: past it, its oldest is
  hung up on, so a flood costs its sender its own connections, not other
  clients theirs. (TLS connections, whose bytes must be decrypted by the
  thread's socket, are read the old way, still under ``HEAD_TIMEOUT_S``.)
- **Streams end on a graceful stop.** On SIGTERM ``environ[STOPPING]`` is
  set and open streams finish at once (clients reconnect with
  ``Last-Event-ID``) instead of holding the stop for ``graceful_timeout``.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, cast

from gunicorn.workers.gthread import TConn, ThreadWorker

STREAM_SLOTS = "keel.stream_slots"
STOPPING = "keel.stopping"
REQUEST_THREADS = 32
HEAD_TIMEOUT_S = 10.0
HEADS_PER_ADDRESS = 256  # incomplete heads one client address may hold in one process
HEAD_END = b"\r\n\r\n"
# A head this long with no end yet goes to a thread as it is: gunicorn's parser then
# answers its limits (request line, header sizes) or reads the rest under HEAD_TIMEOUT_S.
HEAD_BUFFER_MAX = 64 * 1024
RECV_SIZE = 16 * 1024


class HeadReader:
    """Incomplete request heads being read by the main loop: their bytes and deadlines.

    Not thread-safe: only the worker's main loop touches it.
    """

    def __init__(self) -> None:
        self.pending: OrderedDict[Any, float] = OrderedDict()  # connection -> deadline
        self.received: dict[Any, bytearray] = {}
        self.by_address: defaultdict[Any, OrderedDict[Any, None]] = defaultdict(OrderedDict)

    def add(self, conn: Any, now: float) -> list[Any]:
        """Start reading ``conn``'s head; the connections its address must give up (oldest)."""
        self.pending[conn] = now + HEAD_TIMEOUT_S
        self.received[conn] = bytearray()
        mine = self.by_address[_address(conn)]
        mine[conn] = None
        evicted = []
        while len(mine) > HEADS_PER_ADDRESS:
            oldest = next(iter(mine))
            evicted.append(oldest)
            self.remove(oldest)
        return evicted

    def remove(self, conn: Any) -> bytes:
        """Stop reading ``conn``'s head; what was read of it."""
        self.pending.pop(conn, None)
        address = _address(conn)
        mine = self.by_address.get(address)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_address[address]
        return bytes(self.received.pop(conn, b""))

    def feed(self, conn: Any, data: bytes) -> bool:
        """Add ``data`` to ``conn``'s head; whether it is complete (or too long to wait for)."""
        buffer = self.received[conn]
        buffer += data
        return HEAD_END in buffer or len(buffer) >= HEAD_BUFFER_MAX

    def late(self, now: float) -> list[Any]:
        """The connections whose deadline has passed (oldest first), no longer pending."""
        found = []
        for conn, deadline in self.pending.items():
            if deadline > now:
                break  # deadlines grow with insertion: the rest are later
            found.append(conn)
        for conn in found:
            self.remove(conn)
        return found


def _address(conn: Any) -> Any:
    client = getattr(conn, "client", None)
    return client[0] if isinstance(client, tuple) and client else client


class StreamingWorker(ThreadWorker):
    """``gthread`` with threads kept for requests, request heads read by the main loop, and a
    deadline on request heads."""

    def init_process(self) -> None:
        self._reader = HeadReader()
        self._heads: dict[Any, float] = {}  # connection → when its head must be in (threads)
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

    def accept(self, listener: Any) -> None:
        """Accept a connection and read its head in the main loop (``HeadReader``)."""
        if self.cfg.is_ssl:
            super().accept(listener)
            return
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client, address, listener.getsockname())  # non-blocking
        self._read_head(conn)

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        """A kept-alive connection sends its next request: its head is read here too."""
        if self.cfg.is_ssl:
            super().on_client_socket_readable(conn, client)
            return
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._read_head(conn)

    def _read_head(self, conn: Any) -> None:
        for evicted in self._reader.add(conn, time.monotonic()):
            self._hang_up(evicted, "its address holds too many incomplete request heads")
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._head_readable, conn))

    def _head_readable(self, conn: Any, sock: Any) -> None:
        try:
            data = sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before its request was in
            self.poller.unregister(sock)
            self._reader.remove(conn)
            self.nr_conns -= 1
            conn.close()
            return
        if not self._reader.feed(conn, data):
            return
        self.poller.unregister(sock)
        conn.keel_head = self._reader.remove(conn)  # given to its parser by the thread
        conn.data_ready = True  # no thread waits for bytes it already has
        self.enqueue_req(conn)

    def _hang_up(self, conn: Any, why: str) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        self.log.info("closing %s: %s", conn.client, why)
        self.nr_conns -= 1
        conn.close()

    def handle(self, conn: Any) -> Any:
        head = getattr(conn, "keel_head", None)
        if head is not None:  # read by the main loop: the parser takes it as if it read it
            conn.keel_head = None
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(head)
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
        """Called by the main loop at least once a second: also cut heads past their deadline
        (all of those still being read once the worker stops: none has sent a request)."""
        super().murder_keepalived(*args, **kwargs)
        now = time.monotonic()
        late = self._reader.late(now if self.alive else float("inf"))
        for conn in late:
            why = f"request head not received within {HEAD_TIMEOUT_S:.0f} s"
            self._hang_up(conn, why if self.alive else "stopping")
        self._cut_threads_heads(now)

    def _cut_threads_heads(self, now: float) -> None:
        """Heads read by a thread (TLS, or too long to wait for) past their deadline."""
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
