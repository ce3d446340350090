"""Things a process holds back for a moment, to send them together (``Held``).

A queue event that can ride with the next one (``tasks.jobs.observe.events.later``), and
Flower's ``task-sent`` event of a job added on its own (``tasks.jobs.intake.messages``):
each is telemetry that may be a few tens of milliseconds late, and sent alone it costs a
Redis command (and, for the first, a round trip) of its own.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class Held(Generic[T]):
    """Items held back in this process, oldest first, that go out together: with a caller
    that sends anyway (``take``), or from a thread once the oldest has waited ``hold_s()``
    seconds, or when the process exits. A forked child starts empty: it never sends what its
    parent held.

    Order is kept: what the thread took goes out before whatever a caller sends after its
    ``take`` (a job's ``active``, held, before its ``completed``), since ``take`` waits for a
    send of the thread's under way.
    """

    def __init__(self, send: Callable[[list[T]], None], hold_s: Callable[[], float], name: str):
        self._send, self._hold_s, self._name = send, hold_s, name
        self._items: list[tuple[float, T]] = []
        self._lock = threading.Lock()  # the items
        self._sending = threading.Lock()  # a send of held items under way
        self._flushing = False
        self._pid: int | None = None

    def add(self, item: T) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use in this (forked) process
                self._pid, self._items = os.getpid(), []
                self._sending, self._flushing = threading.Lock(), False
                threading.Thread(target=self._flush_forever, name=self._name, daemon=True).start()
                atexit.register(self.flush)
            self._items.append((time.monotonic() + self._hold_s(), item))

    def take(self) -> list[T]:
        """Everything held, oldest first, now the caller's to send (after whatever the
        thread is sending: the caller's send goes out after it)."""
        # Read without the locks first: the common case, nothing held or going, takes none.
        if self._pid != os.getpid() or not (self._items or self._flushing):
            return []
        with self._sending:
            return self._taken()

    def flush(self) -> None:
        """Send what is held now (at exit: what the thread had no time to send)."""
        if self._pid != os.getpid():
            return
        with self._sending:
            self._flushing = True
            try:
                taken = self._taken()
                if taken:
                    self._send(taken)
            except Exception:  # telemetry: logged, never raised into a caller or at exit
                log.warning("%s: held items not sent", self._name, exc_info=True)
            finally:
                self._flushing = False

    def _taken(self) -> list[T]:
        with self._lock:
            taken = [item for _, item in self._items]
            self._items = []
        return taken

    def _flush_forever(self) -> None:
        while True:
            time.sleep(max(self._hold_s(), 0.005))
            with self._lock:
                due = bool(self._items) and self._items[0][0] <= time.monotonic()
            if due:
                self.flush()
