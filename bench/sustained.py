"""Sustained: does Keel stay level under a steady load for minutes, with retention on?

A Postgres queue can keep up for a benchmark's seconds and still fall behind in
month three: its tables and their dead tuples grow faster than autovacuum and
retention take them away, and every statement slows with them. This runs one
Keel worker (``-c 2``, prefork, as P1's) for ``--minutes`` at a steady fraction
of what the same worker drained in a burst just before (``--fraction``, half by
default), no-op jobs added one by one from this process at a fixed pace, with
the default retention deleting completed records once ``--keep-completed-s``
old (every ``KEEL_RETENTION_INTERVAL_S``, 60 s).

Every ``--sample-s`` seconds it reads, from Postgres: the jobs that finished
since the last sample and how long each waited from its add to its start
(``processed_on - created_at``: the claim, the broker and the queue ahead of
it); the ``jobs`` table's size (heap and indexes), its live and dead tuples and
its HOT share of updates, the counter deltas' rows, and autovacuum's and
autoanalyze's runs so far (``pg_stat_user_tables``). Per minute the report
gives throughput, wait p50/p99, table size and dead tuples; then the last
minute's throughput over the first's, and the slope of the table's size and
dead tuples over the second half of the run (per minute: level means near 0).

    python -m bench.sustained [--minutes 10] [--fraction 0.5] [--keep-completed-s 60]

Uses the embedded servers unless ``KEEL_DATABASE_URL`` / ``KEEL_REDIS_URL`` are set.
Writes ``bench/results/sustained-<UTC timestamp>.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

from bench.env import BenchEnv
from bench.plan import QUICK, Run
from bench.report import log, measured_commit, write_report
from bench.stats import percentile

_FINISHED = (
    "SELECT extract(epoch FROM finished_on),"
    " extract(epoch FROM processed_on - created_at)"
    " FROM jobs WHERE finished_on > to_timestamp(%s) AND finished_on <= to_timestamp(%s)"
    " AND name = %s"
)
_TABLES = (
    "SELECT relname, pg_total_relation_size(relid), pg_relation_size(relid), n_live_tup,"
    " n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, autoanalyze_count"
    " FROM pg_stat_user_tables WHERE relname IN ('jobs', 'job_count_deltas')"
)
TABLE_FIELDS = (
    *("total_bytes", "heap_bytes", "live", "dead"),
    *("updates", "hot", "vacuums", "analyzes"),
)


def tables(pg: psycopg.Connection) -> dict[str, dict[str, int]]:
    return {
        row[0]: dict(zip(TABLE_FIELDS, map(int, row[1:]), strict=True))
        for row in pg.execute(_TABLES).fetchall()
    }


def calibrate(run: Run, n: int) -> float:
    """What the warmed-up worker drains, in jobs/s, from one burst of ``n`` no-op jobs."""
    from bench import jobs
    from bench.fig_jobs import keel_batch

    keel_batch(run, jobs.NOOP, 200, None)[1]()
    result, cleanup = keel_batch(run, jobs.NOOP, n, None)
    cleanup()
    return float(result["rate"])


def paced(rate: float, seconds: float, on_sample: Any, sample_s: float) -> int:
    """Add no-op jobs at ``rate`` per second for ``seconds``; ``on_sample()`` every
    ``sample_s``. Returns how many were added (a late producer catches up, never bursts
    more than a second's worth)."""
    from bench import jobs
    from tasks.jobs import add

    started = time.monotonic()
    next_sample = started + sample_s
    added = 0
    while (now := time.monotonic()) - started < seconds:
        due = int((now - started) * rate)
        for _ in range(min(due - added, int(rate) + 1)):
            add(jobs.NOOP, {"i": added}, queue=jobs.QUEUE)
            added += 1
        if now >= next_sample:
            on_sample()
            next_sample += sample_s
        time.sleep(max(0.0, min(0.01, started + (added + 1) / rate - time.monotonic())))
    return added


class Sampler:
    """Reads Postgres every sample: finished jobs since the last one, and the tables."""

    def __init__(self, pg: psycopg.Connection, name: str) -> None:
        self.pg, self.name = pg, name
        self.last = time.time()
        self.samples: list[dict[str, Any]] = []

    def __call__(self) -> None:
        now = time.time()
        rows = self.pg.execute(_FINISHED, (self.last, now, self.name)).fetchall()
        self.samples.append(
            {
                "at": now,
                "finished": len(rows),
                "waits": [float(w) for _, w in rows if w is not None],
                "tables": tables(self.pg),
            }
        )
        self.last = now


def per_minute(samples: list[dict[str, Any]], sample_s: float) -> list[dict[str, Any]]:
    """The samples by minute of the run: the i-th (from 0) counts what finished in the
    ``sample_s`` seconds before it, so it belongs to the minute those seconds are in."""
    minutes: dict[int, list[dict[str, Any]]] = {}
    for i, sample in enumerate(samples):
        minutes.setdefault(int(i * sample_s // 60), []).append(sample)
    out = []
    for minute, group in sorted(minutes.items()):
        waits = [w for s in group for w in s["waits"]]
        last = group[-1]["tables"]
        jobs, deltas = last.get("jobs", {}), last.get("job_count_deltas", {})
        out.append(
            {
                "minute": minute + 1,
                "completed": sum(s["finished"] for s in group),
                "jobs_s": sum(s["finished"] for s in group) / 60,
                "wait_p50_ms": 1000 * percentile(waits, 50) if waits else None,
                "wait_p99_ms": 1000 * percentile(waits, 99) if waits else None,
                "jobs_mb": jobs.get("total_bytes", 0) / 1e6,
                "jobs_live": jobs.get("live", 0),
                "jobs_dead": jobs.get("dead", 0),
                "hot_share": jobs.get("hot", 0) / jobs["updates"] if jobs.get("updates") else None,
                "deltas_rows": deltas.get("live", 0) + deltas.get("dead", 0),
                "vacuums": jobs.get("vacuums", 0),
                "analyzes": jobs.get("analyzes", 0),
            }
        )
    return out


def slope(rows: list[dict[str, Any]], key: str) -> float | None:
    """Least-squares change of ``key`` per minute over the second half of the run."""
    half = rows[len(rows) // 2 :]
    if len(half) < 2:
        return None
    xs = [r["minute"] for r in half]
    ys = [float(r[key]) for r in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else None


def _f(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    meta, rows, summary = report["meta"], report["minutes"], report["summary"]
    lines = [
        f"## Sustained: {meta['minutes']} minutes at {meta['rate']:.0f} jobs/s "
        f"({meta['fraction']:.0%} of the {meta['capacity']:.0f} jobs/s a burst drained)",
        "",
        f"Commit {meta['commit']}, {meta['started']}, {meta['cpus']} CPUs. Retention: "
        f"completed records deleted once {meta['keep_completed_s']} s old. Added "
        f"{meta['added']:,} jobs. Servers: {meta['servers']}.",
        "",
        "| Minute | Completed | jobs/s | wait p50 | wait p99 | `jobs` MB | live | dead "
        "| HOT updates | deltas rows | autovacuums |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        hot = "n/a" if r["hot_share"] is None else f"{r['hot_share']:.0%}"
        lines.append(
            f"| {r['minute']} | {r['completed']:,} | {r['jobs_s']:.1f} "
            f"| {_f(r['wait_p50_ms'])} ms | {_f(r['wait_p99_ms'])} ms | {r['jobs_mb']:.1f} "
            f"| {r['jobs_live']:,} | {r['jobs_dead']:,} | {hot} | {r['deltas_rows']:,} "
            f"| {r['vacuums']} |"
        )
    lines += [
        "",
        f"- Last full minute's throughput / first's: **{_f(summary['last_over_first'], 2)}**"
        " (target ≥ 0.9).",
        f"- Second half's slope per minute: `jobs` size {_f(summary['size_mb_per_min'], 2)} MB,"
        f" dead tuples {_f(summary['dead_per_min'], 0)}, live rows "
        f"{_f(summary['live_per_min'], 0)}, wait p99 {_f(summary['wait_p99_ms_per_min'], 1)} ms.",
        f"- Autovacuum ran {summary['vacuums']} times on `jobs` and autoanalyze "
        f"{summary['analyzes']} times.",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sustained",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fraction", type=float, default=0.5, help="of the burst's rate")
    parser.add_argument("--keep-completed-s", type=int, default=60)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--calibrate-jobs", type=int, default=2000)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ["KEEL_KEEP_COMPLETED_S"] = str(args.keep_completed_s)
    env = BenchEnv()
    started = datetime.now(UTC)
    try:
        env.start()
        # Imported once the servers are up: these modules read Keel's settings.
        from bench import jobs
        from bench.procs import CeleryWorker

        run = Run(env=env, sizes=QUICK, repeat=1, quick=False)
        pg = psycopg.connect(os.environ["KEEL_DATABASE_URL"], autocommit=True)
        with CeleryWorker(env, "keel-sustained", "tasks", 2, ["-I", "bench.jobs"]):
            capacity = calibrate(run, args.calibrate_jobs)
            rate = args.fraction * capacity
            log(f"burst drained {capacity:.0f} jobs/s; adding {rate:.0f} jobs/s")
            sampler = Sampler(pg, jobs.NOOP)
            sampler()
            added = paced(rate, args.minutes * 60, sampler, args.sample_s)
            sampler()
        pg.close()
        meta = {
            "commit": measured_commit(),
            "started": started.isoformat(timespec="seconds"),
            "minutes": args.minutes,
            "fraction": args.fraction,
            "capacity": capacity,
            "rate": rate,
            "added": added,
            "keep_completed_s": args.keep_completed_s,
            "cpus": os.cpu_count(),
            "servers": ", ".join(f"{k} {v}" for k, v in env.describe().items()),
        }
    finally:
        env.stop()
    minutes = per_minute(sampler.samples[1:], args.sample_s)
    rows = [r for r in minutes if r["minute"] <= args.minutes]
    full = [r for r in rows if r["minute"] <= int(args.minutes)]
    first, last = (full[0], full[-1]) if full else (None, None)
    last_jobs = sampler.samples[-1]["tables"].get("jobs", {})
    summary = {
        "last_over_first": last["jobs_s"] / first["jobs_s"] if first and first["jobs_s"] else None,
        "size_mb_per_min": slope(rows, "jobs_mb"),
        "dead_per_min": slope(rows, "jobs_dead"),
        "live_per_min": slope(rows, "jobs_live"),
        "wait_p99_ms_per_min": slope(
            [r for r in rows if r["wait_p99_ms"] is not None], "wait_p99_ms"
        ),
        "vacuums": last_jobs.get("vacuums", 0),
        "analyzes": last_jobs.get("analyzes", 0),
    }
    for sample in sampler.samples:  # the minutes keep their percentiles; not every wait
        sample["waits"] = len(sample["waits"])
    report = {"meta": meta, "minutes": rows, "summary": summary, "samples": sampler.samples}
    table = markdown(report)
    print(table)
    log(f"wrote {write_report('sustained', report, table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
