"""P11: pickup latency, from a job's add to its handler's start, under a steady load.

Bare Celery, Keel and procrastinate (when installed) in turn within every repetition,
each with P1's worker (``-c 2``; Celery's prefork with late acks and prefetch 1, Keel's
``-I bench.jobs``, procrastinate's worker CLI), fresh for the repetition. With the
worker warmed up as in P1, one repetition of a system:

1. **Capacity**: P1's batch, ``noop_jobs`` no-op jobs added one by one from this
   process, timed from the first add to the last one finished (as P1 measures it).
2. **Half load, then 90%**: an open-loop producer adds jobs at a fixed rate, 0.5x and
   0.9x that capacity, for ``pickup_seconds`` each (job ``i`` is added at ``i / rate``
   after the start, or at once if the producer is behind: it never waits for a job).
3. **Delayed**: the same at half load, each job with a delay of 1-2 s (Celery's
   ``countdown``, Keel's ``JobOptions(delay=)``, procrastinate's ``schedule_in``).

Each job carries ``time.time()`` read just before its add call, and when it is due
(that plus its delay); its handler's first act is to write those and its own start time
to a file of its worker process (``bench.pickup``: the same task body and the same
method on every system). The figure is p50/p99 of start - add (pickup) per load level,
and of start - due (lateness) for the delayed jobs; a delay counts from before the add
call, as the caller sees it, so the add's own latency is in both figures.

**The rates are each system's own**, from the capacity step of the same repetition:
"half load" is half of what that system drains on this host at that moment, so each is
compared at the same utilisation. One common rate (from the slowest system) would run
the faster systems at a smaller share of their capacity and make their queues look
emptier for a reason P1 already measures (throughput). The achieved add rate is kept
(``add_rate``) beside the rate asked for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
import redis
from sqlalchemy import text

from bench import pickup
from bench.peers import database_url
from bench.plan import Batch, Run, batch_timeout
from bench.procs import CeleryWorker, Child
from bench.stats import Figure, Series, ratio

POLL_S = 0.1
P99_TARGET = 1.0  # Keel's p99 pickup at half load over bare Celery's, at most
LEVELS = (("half load", 0.5), ("90%", 0.9))
DELAYED_FRACTION = 0.5  # the delayed jobs are added at half load
BASELINE = "bare Celery"


@dataclass
class Side:
    """One system in P11: its worker, P1's batch, and how to add, await and remove jobs."""

    worker: Callable[[], Child]
    burst: Callable[[int], Batch]  # P1's batch of k no-op jobs (the capacity)
    add: Callable[[str, float, int], Any]  # (stamp folder, add time, delay ms) -> job id
    finished: Callable[[list], int]  # how many of these jobs ended
    cleanup: Callable[[list], None]
    session: Callable[[], AbstractContextManager] = nullcontext  # around a phase's adds


def _bare(run: Run) -> Side:
    from bench import bare
    from bench.fig_jobs import bare_batch

    client = redis.Redis.from_url(run.env.child_env()["KEEL_REDIS_URL"])
    conc = run.sizes.worker_concurrency

    def add(out: str, added: float, delay: int) -> str:
        extra = {"countdown": delay / 1000} if delay else {}
        args = (out, added, added + delay / 1000)
        return bare.stamp.apply_async(args=args, queue=bare.QUEUE, **extra).id

    def finished(ids: list) -> int:
        ended = 0
        for start in range(0, len(ids), 1000):
            keys = [f"celery-task-meta-{i}" for i in ids[start : start + 1000]]
            metas = [json.loads(raw) for raw in client.mget(keys) if raw]
            ended += sum(meta.get("status") in ("SUCCESS", "FAILURE") for meta in metas)
        return ended

    def cleanup(ids: list) -> None:
        for start in range(0, len(ids), 1000):
            client.delete(*[f"celery-task-meta-{i}" for i in ids[start : start + 1000]])

    return Side(
        worker=lambda: CeleryWorker(run.env, "bare-pickup", "bench.bare", conc, ["-Q", bare.QUEUE]),
        burst=lambda k: bare_batch(run, bare.noop, k),
        add=add,
        finished=finished,
        cleanup=cleanup,
    )


def _keel(run: Run) -> Side:
    from bench import jobs
    from bench.fig_jobs import keel_batch
    from tasks.jobs import JobOptions
    from tasks.jobs import add as add_job
    from tasks.jobs.store import counts
    from tasks.platform.db import transaction

    conc = run.sizes.worker_concurrency
    ended = text(
        "SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND state IN ('completed', 'failed')"
    )

    def add(out: str, added: float, delay: int) -> str:
        data = {"out": out, "added": added, "due": added + delay / 1000}
        opts = JobOptions(delay=delay) if delay else None
        return add_job(jobs.STAMP, data, queue=jobs.QUEUE, opts=opts).job_id

    def finished(ids: list) -> int:
        with transaction() as session:
            return int(session.execute(ended, {"ids": ids}).scalar_one())

    def cleanup(ids: list) -> None:  # as P1's batch: every phase on the same table size
        with transaction() as session:
            session.execute(text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": ids})
        counts.compact(max_rows=10 * len(ids))

    return Side(
        worker=lambda: CeleryWorker(run.env, "keel-pickup", "tasks", conc, ["-I", "bench.jobs"]),
        burst=lambda k: keel_batch(run, jobs.NOOP, k, None),
        add=add,
        finished=finished,
        cleanup=cleanup,
    )


def _procrastinate(run: Run) -> Side:
    from bench.peers import procrastinate_jobs
    from bench.peers.systems import (
        _PROCRASTINATE_DONE,
        ProcrastinateWorker,
        install_procrastinate,
        procrastinate_batch,
    )

    install_procrastinate()
    conc = run.sizes.worker_concurrency
    stamp = procrastinate_jobs.stamp

    def add(out: str, added: float, delay: int) -> int:
        task = stamp.configure(schedule_in={"milliseconds": delay}) if delay else stamp
        return task.defer(out=out, added=added, due=added + delay / 1000)

    def finished(ids: list) -> int:
        with psycopg.connect(database_url(), autocommit=True) as connection:
            row = connection.execute(_PROCRASTINATE_DONE, (ids,)).fetchone()
        return int(row[0]) if row else 0

    def cleanup(ids: list) -> None:  # its events go with their jobs (ON DELETE CASCADE)
        with psycopg.connect(database_url(), autocommit=True) as connection:
            connection.execute("DELETE FROM procrastinate_jobs WHERE id = ANY(%s)", (ids,))

    return Side(
        worker=lambda: ProcrastinateWorker(run.env, conc),
        burst=lambda k: procrastinate_batch(k, False),
        add=add,
        finished=finished,
        cleanup=cleanup,
        session=procrastinate_jobs.app.open,
    )


def sides(run: Run) -> tuple[dict[str, Side], list[str]]:
    """Bare Celery, Keel and procrastinate if it imports; a note if it does not."""
    from bench.peers.systems import importable

    found = {BASELINE: _bare(run), "Keel": _keel(run)}
    if importable("procrastinate"):
        found["procrastinate"] = _procrastinate(run)
        return found, []
    return found, ["procrastinate left out: not installed (pip install -e '.[bench]')"]


def paced(side: Side, out: Path, rate: float, seconds: float, delayed: bool) -> dict[str, Any]:
    """Add ``rate * seconds`` jobs at ``rate`` per second (open loop), wait until every one
    ended, and summarise their stamps; the jobs are removed afterwards."""
    n = max(2, round(rate * seconds))
    ids: list = []
    behind = 0.0  # the most the producer fell behind its schedule (s)
    with side.session():
        began = time.monotonic()
        for i in range(n):
            ahead = began + i / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            else:
                behind = max(behind, -ahead)
            ids.append(side.add(str(out), time.time(), pickup.delay_ms(i) if delayed else 0))
    deadline = time.monotonic() + batch_timeout(n) + (2 if delayed else 0)
    while (ended := side.finished(ids)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n - ended} of {n} jobs unfinished")
        time.sleep(POLL_S)
    stamps = pickup.read(out)
    side.cleanup(ids)
    if len(stamps) != n:
        raise RuntimeError(f"{len(stamps)} start stamps for {n} jobs in {out.name}")
    return {
        **pickup.summary(stamps),
        "rate": rate,
        "behind_max_ms": 1000 * behind,  # the producer's, against its schedule
        "slowest": pickup.slowest(stamps),
    }


def repetition(run: Run, name: str, side: Side, rep: int) -> dict[str, Any]:
    """One system's repetition: a fresh warmed-up worker, its capacity, then each phase."""
    folder = run.env.home / "p11" / f"{name.replace(' ', '-')}-{rep}"
    seconds = run.sizes.pickup_seconds
    found: dict[str, Any] = {"system": name, "rep": rep}
    with side.worker():
        side.burst(run.sizes.warmup_jobs)[1]()
        result, cleanup = side.burst(run.sizes.noop_jobs)
        cleanup()
        capacity = found["capacity"] = result["rate"]
        run.log(f"  {name}: capacity {capacity:.0f} jobs/s")
        phases = [(level, fraction, False) for level, fraction in LEVELS]
        phases.append(("delayed", DELAYED_FRACTION, True))
        for level, fraction, delayed in phases:
            phase = paced(side, folder / level, fraction * capacity, seconds, delayed)
            found[level] = phase
            what = "lateness" if delayed else "pickup"
            run.log(
                f"  {name} {level}: {phase['jobs']} jobs at {phase['add_rate']:.0f}/s "
                f"(asked {phase['rate']:.0f}/s), {what} p50 {phase[f'{what}_p50_ms']:.1f} ms, "
                f"p99 {phase[f'{what}_p99_ms']:.1f} ms"
            )
    return found


# What the table shows, per system: (label, phase, summary key, unit, charted).
QUANTITIES = (
    ("p99 pickup, half load", "half load", "pickup_p99_ms", "ms", True),
    ("p50 pickup, half load", "half load", "pickup_p50_ms", "ms", False),
    ("p99 pickup, 90%", "90%", "pickup_p99_ms", "ms", False),
    ("p50 pickup, 90%", "90%", "pickup_p50_ms", "ms", False),
    ("p99 lateness, delayed 1-2 s", "delayed", "lateness_p99_ms", "ms", False),
    ("p50 lateness, delayed 1-2 s", "delayed", "lateness_p50_ms", "ms", False),
    ("capacity (P1's batch)", None, "capacity", "jobs/s", False),
)


def _series(runs: list[dict[str, Any]], names: list[str]) -> dict[tuple[str, str], Series]:
    found = {}
    for label, phase, key, unit, chart in QUANTITIES:
        for name in names:
            series = Series(f"{name} {label}", unit, chart=chart)
            for r in (r for r in runs if r["system"] == name):
                series.samples.append(r[key] if phase is None else r[phase][key])
            found[(name, label)] = series
    return found


def p11_pickup(run: Run) -> Figure:
    fig = Figure(
        "P11",
        "Pickup latency, add → start, at 50% and 90% of P1's capacity",
        target=f"Keel p99 pickup at half load ≤ {P99_TARGET}x bare Celery's (same run)",
    )
    found, left_out = sides(run)
    runs: list[dict[str, Any]] = []
    for rep in range(run.repeat):
        for name, side in found.items():  # A, B, C, A, B, C, ...
            run.log(f"P11 rep {rep + 1}/{run.repeat}: {name}")
            runs.append(repetition(run, name, side, rep))
    series = _series(runs, list(found))
    fig.series = list(series.values())
    others = [name for name in found if name != BASELINE]
    ratios = {
        label: {name: ratio(series[(name, label)], series[(BASELINE, label)]) for name in others}
        for label, *_ in QUANTITIES
    }
    fig.ratio = ratios["p99 pickup, half load"]["Keel"]
    fig.ratio_text = "Keel / bare Celery (p99 pickup at half load, ms)"
    fig.met = fig.ratio <= P99_TARGET
    rates = {
        (name, level): median(r[level]["add_rate"] for r in runs if r["system"] == name)
        for name in found
        for level in (*(level for level, _ in LEVELS), "delayed")
    }
    fig.details = {
        "runs": runs,
        "ratios_vs_bare": ratios,
        "rate_basis": "each system's own capacity, measured in the same repetition",
        "levels": dict(LEVELS),
        "pickup_seconds": run.sizes.pickup_seconds,
        "delay_ms": [1000, 2000],
        "systems": list(found),
    }
    fig.notes.append(
        "over bare Celery (ratio of medians): "
        + "; ".join(
            f"{label}: " + ", ".join(f"{name} {ratios[label][name]:.2f}x" for name in others)
            for label, *_ in QUANTITIES
        )
    )
    fig.notes.append(
        f"open-loop producer (one thread), {run.sizes.pickup_seconds:g} s per level at each "
        "system's own capacity from P1's batch in the same repetition; achieved add rates "
        "(median): "
        + "; ".join(
            f"{name} "
            + ", ".join(f"{level} {rates[(name, level)]:.0f}/s" for level in ("half load", "90%"))
            for name in found
        )
    )
    fig.notes.append(
        "delayed jobs (1-2 s, added at half load for the same time as a level): bare Celery's "
        "worker holds each message and runs it from a timer; Keel's are promoted by each "
        "worker's maintenance thread every KEEL_PROMOTE_INTERVAL_S (0.1 s)"
        + (
            "; procrastinate's worker looks for due jobs when an insert notifies it, else every "
            "5 s (its default fetch_job_polling_interval, as in P1), so a job that falls due "
            "after the phase's last insert waits for that poll"
            if "procrastinate" in found
            else ""
        )
    )
    fig.notes.extend(left_out)
    return fig
