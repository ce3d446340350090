"""P11's stamps: when each job started, written by the job itself, the same way on every system.

A P11 job carries the folder of its batch, the time it was added (``time.time()`` just
before the add call) and the time it was due (the add time plus its delay, if any). Its
first act is to read ``time.time()`` and append one line, ``added due started``, to a
file of its own worker process in that folder (opened once per batch, line-buffered:
one ``write`` a job, no server involved). The bench reads the folder once the batch has
finished. Everything is on one host, so the three clocks are one.

Standard library only: the bare Celery app, Keel's worker and procrastinate's load it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

from bench.stats import percentile


class Stamp(NamedTuple):
    """One job: when it was added, when it was due and when its handler started (epoch s)."""

    added: float
    due: float
    started: float

    @property
    def pickup_ms(self) -> float:
        """From the add call to the handler's start."""
        return 1000 * (self.started - self.added)

    @property
    def lateness_ms(self) -> float:
        """From when the job was due to its start (its pickup, for a job with no delay)."""
        return 1000 * (self.started - self.due)


_open: dict[str, TextIO] = {}  # this process's file in the batch folder it last wrote to


def record(out: str, added: float, due: float, started: float) -> None:
    """Append this job's stamp to this process's file in ``out``."""
    handle = _open.get(out)
    if handle is None:
        for old in _open.values():  # a worker runs one batch at a time
            old.close()
        _open.clear()
        os.makedirs(out, exist_ok=True)
        handle = _open[out] = open(  # noqa: SIM115 (kept open for the batch's next jobs)
            os.path.join(out, f"{os.getpid()}.tsv"), "a", buffering=1
        )
    handle.write(f"{added!r}\t{due!r}\t{started!r}\n")


def parse(lines: Iterable[str]) -> list[Stamp]:
    """The stamps of complete lines (a line still being written has no newline yet)."""
    stamps = []
    for line in lines:
        if line.endswith("\n") and line.strip():
            added, due, started = (float(part) for part in line.split("\t"))
            stamps.append(Stamp(added, due, started))
    return stamps


def read(out: Path) -> list[Stamp]:
    """Every stamp written to the batch folder ``out``, all processes' files."""
    stamps: list[Stamp] = []
    for path in sorted(out.glob("*.tsv")):
        with path.open() as handle:
            stamps.extend(parse(handle))
    return stamps


def add_rate(stamps: Sequence[Stamp]) -> float:
    """Jobs added per second, from the first add to the last (``nan`` under two jobs)."""
    adds = sorted(s.added for s in stamps)
    if len(adds) < 2 or adds[-1] <= adds[0]:
        return float("nan")
    return (len(adds) - 1) / (adds[-1] - adds[0])


def summary(stamps: Sequence[Stamp]) -> dict[str, float]:
    """p50, p99 and max of pickup and lateness (ms), the jobs and the achieved add rate."""
    pickups = [s.pickup_ms for s in stamps]
    late = [s.lateness_ms for s in stamps]
    return {
        "jobs": len(stamps),
        "add_rate": add_rate(stamps),
        "pickup_p50_ms": percentile(pickups, 50),
        "pickup_p99_ms": percentile(pickups, 99),
        "pickup_max_ms": max(pickups, default=float("nan")),
        "lateness_p50_ms": percentile(late, 50),
        "lateness_p99_ms": percentile(late, 99),
        "lateness_max_ms": max(late, default=float("nan")),
    }


def slowest(stamps: Sequence[Stamp], k: int = 5) -> list[tuple[float, float]]:
    """The ``k`` latest starts as (seconds from the batch's first add, lateness ms), in add
    order: whether a tail is one stall (adjacent adds) or spread over the batch."""
    if not stamps:
        return []
    first = min(s.added for s in stamps)
    worst = sorted(stamps, key=lambda s: s.lateness_ms, reverse=True)[:k]
    return [(s.added - first, s.lateness_ms) for s in sorted(worst, key=lambda s: s.added)]


def delay_ms(i: int, low_ms: int = 1000, spread_ms: int = 1000) -> int:
    """The ``i``-th delayed job's delay: spread over ``low_ms`` .. ``low_ms + spread_ms``
    (a fixed stride, not random: every system gets the same delays in the same order)."""
    return low_ms + (i * 7919) % spread_ms
