"""Measuring what ran when, from the job records' run timelines."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from sqlalchemy import text

from tasks.platform.db import transaction
from tests.support.client import ts


def run_intervals(jobs: list[dict[str, Any]]) -> list[tuple[datetime, datetime]]:
    """``(startedAt, finishedAt)`` of every finished run of ``jobs``."""
    return [
        (ts(run["startedAt"]), ts(run["finishedAt"]))
        for job in jobs
        for run in job["runs"]
        if run.get("startedAt") and run.get("finishedAt")
    ]


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end and a start at the same instant don't)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = peak = 0
    for _, step in edges:  # at equal times -1 sorts first
        open_now += step
        peak = max(peak, open_now)
    return peak


def max_in_window(moments: list[datetime], window_s: float) -> int:
    """The most ``moments`` inside any half-open window ``[t, t + window_s)``."""
    ordered = sorted(moments)
    peak = first = 0
    for last, moment in enumerate(ordered):
        while (moment - ordered[first]).total_seconds() >= window_s:
            first += 1
        peak = max(peak, last - first + 1)
    return peak


def active_count(queue: str) -> int:
    with transaction() as session:
        return session.scalar(
            text("SELECT count(*) FROM jobs WHERE queue = :queue AND state = 'active'"),
            {"queue": queue},
        )


class ActiveSampler:
    """Samples the number of ``active`` records of a queue in a background thread."""

    def __init__(self, queue: str, interval_s: float = 0.02) -> None:
        self.queue = queue
        self.interval_s = interval_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ActiveSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(active_count(self.queue))
