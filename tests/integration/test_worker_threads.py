"""A worker's own threads (maintenance, the commit listener) end with the worker, however it
stops: one left behind listens on, and logs about, a database that may be gone."""

from __future__ import annotations

import threading

from tests.support.inline import inline_worker
from tests.support.stack import wait_for

KEEL_THREADS = ("keel-maintenance", "keel-committed")


def keel_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in KEEL_THREADS and t.is_alive()]


def test_the_worker_threads_end_when_an_inline_worker_stops(stack):
    assert keel_threads() == []  # (none left by an earlier module in this process)
    with inline_worker(concurrency=2):
        wait_for(lambda: sorted(keel_threads()) == sorted(KEEL_THREADS), timeout=30)
    assert keel_threads() == []
