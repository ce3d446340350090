"""A value this process read from the store and reads again when it is ``every_s`` old
(``Refreshed``): the live queue limits and key-limit overrides a worker admits by."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class Refreshed(Generic[T]):
    """``read()``'s last answer, read again by the first caller that finds it ``every_s``
    old: one caller reads, and the others meanwhile get the copy there is, but for the
    first read, which every caller waits for. If a read fails, the last answer holds
    (``empty`` before any) and the next read is ``every_s`` later."""

    def __init__(self, read: Callable[[], T], empty: T, every_s: float, what: str) -> None:
        self._read, self._every_s, self._what = read, every_s, what
        self._value = empty
        self._read_at = float("-inf")
        self._read_once = False
        self._lock = threading.Lock()

    def get(self) -> T:
        if time.monotonic() - self._read_at > self._every_s:
            if not self._read_once:  # no copy yet: everyone waits for the first read
                with self._lock:
                    if not self._read_once:
                        self._refresh()
            elif self._lock.acquire(blocking=False):  # else another caller is reading
                try:
                    if time.monotonic() - self._read_at > self._every_s:
                        self._refresh()
                finally:
                    self._lock.release()
        return self._value

    def forget(self) -> None:
        """Read again at the next ``get`` (this process just changed what it reads)."""
        self._read_at = float("-inf")

    def _refresh(self) -> None:
        try:
            self._value = self._read()
        except Exception:  # the last read holds; a claim would need the store anyway
            log.warning("could not read %s; keeping the last read", self._what)
        self._read_at = time.monotonic()
        self._read_once = True
