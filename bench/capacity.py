"""Capacity: what one no-op Keel job costs each server, and what that allows past one machine.

One Keel worker (``-c 2``, prefork, as P1's) runs batches of no-op jobs added
one by one from this process, as in P1. Around each measured batch the servers'
own counters are read:

- Postgres (``pg_stat_database`` of Keel's database, ``pg_stat_wal``):
  transactions committed, rows inserted, updated and deleted, WAL bytes,
  records and full-page images; the server's CPU (its process tree);
- Redis (``INFO``): commands by name, requests (``total_reads_processed``: a
  pipeline is one), and the server's own CPU (``used_cpu_user + used_cpu_sys``);
- the worker tree's CPU and this process's (the producer).

A last, untimed batch turns the server's statement log on and counts the
statements (embedded Postgres only: an external server's log is not ours).
Everything is divided by the jobs of the batch; the batch's own progress polls
(one statement every 0.1 s) are taken out of the commits. What the idle parts
do meanwhile (the promoter's tick, heartbeats) is in, as it is in production.

From the per-job costs the report derives ceilings: the jobs/s that one
Postgres primary's CPU allows at 8, 32 and 64 cores (linear: an upper bound,
before lock and WAL contention), that one Redis allows (one core, whatever the
machine), the WAL rate and commits/s at those rates, and the worker cores they
need. ``docs/operations/capacity.md`` reads its figures from this report.

    python -m bench.capacity [--jobs 2000] [--runs 3]

Uses the embedded servers unless ``KEEL_DATABASE_URL`` / ``KEEL_REDIS_URL`` are
set (then server CPU is not measured). Writes
``bench/results/capacity-<UTC timestamp>.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from statistics import median
from typing import Any

import psycopg
import redis

from bench.env import BenchEnv
from bench.meters import CpuMeter, RoundTrips
from bench.plan import QUICK, Run
from bench.report import log, measured_commit, write_report

CORES = (8, 32, 64)
_PG_COUNTERS = (
    "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, blks_hit, blks_read"
    " FROM pg_stat_database WHERE datname = current_database()"
)
_PG_WAL = "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
PG_FIELDS = ("commits", "inserted", "updated", "deleted", "blocks_hit", "blocks_read")
WAL_FIELDS = ("wal_records", "wal_fpi", "wal_bytes")
# A backend reports its counters to the shared statistics at most once a second.
STATS_FLUSH_S = 1.5


class ServerCounters:
    """The counters Postgres and Redis keep, read before and after a batch."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.pg = psycopg.connect(database_url, autocommit=True)
        self.redis = redis.Redis.from_url(redis_url)

    def read(self) -> dict[str, Any]:
        counters = self.pg.execute(_PG_COUNTERS).fetchone()
        wal = self.pg.execute(_PG_WAL).fetchone()
        assert counters is not None and wal is not None
        info = self.redis.info("all")
        commands = {
            name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in info.items()
            if name.startswith("cmdstat_")
        }
        return {
            **dict(zip(PG_FIELDS, map(int, counters), strict=True)),
            **dict(zip(WAL_FIELDS, map(float, wal), strict=True)),
            "redis_commands": commands,
            "redis_requests": int(info["total_reads_processed"]),
            "redis_cpu_s": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        }

    def close(self) -> None:
        self.pg.close()
        self.redis.close()


def _per_job(before: dict[str, Any], after: dict[str, Any], n: int, polls: int) -> dict:
    """Each counter's growth per job; the batch's ``polls`` (one commit each) taken out."""
    out: dict[str, Any] = {
        name: (after[name] - before[name]) / n for name in (*PG_FIELDS, *WAL_FIELDS)
    }
    out["commits"] = (after["commits"] - before["commits"] - polls) / n
    out["redis_requests"] = (after["redis_requests"] - before["redis_requests"] - 2) / n
    out["redis_cpu_ms"] = 1000 * (after["redis_cpu_s"] - before["redis_cpu_s"]) / n
    names = set(after["redis_commands"]) | set(before["redis_commands"])
    commands = {
        name: (after["redis_commands"].get(name, 0) - before["redis_commands"].get(name, 0)) / n
        for name in names
    }
    commands["info"] = commands.get("info", 0) - 2 / n  # the two readings' own INFO
    out["redis_commands"] = {k: v for k, v in sorted(commands.items()) if v >= 0.01}
    out["redis_commands_total"] = sum(out["redis_commands"].values())
    return out


def measure(run: Run, worker_pid: int, counters: ServerCounters, n: int) -> dict[str, Any]:
    """One batch of ``n`` no-op jobs: its rate and every cost per job."""
    from bench import jobs
    from bench.fig_jobs import keel_batch

    meter = CpuMeter({"worker": worker_pid, **run.env.server_pids()})
    time.sleep(STATS_FLUSH_S)  # the last batch's cleanup reaches the statistics first
    cpu_before, before = meter.read(), counters.read()
    result, cleanup = keel_batch(run, jobs.NOOP, n, None)
    time.sleep(STATS_FLUSH_S)
    cpu_after, after = meter.read(), counters.read()
    cleanup()
    polls = result.get("polls", 0)
    costs = _per_job(before, after, n, polls)
    spent = CpuMeter.spent(cpu_before, cpu_after)
    # The idle seconds after the batch cost the worker and servers little, but not nothing.
    costs["cpu_ms"] = {group: 1000 * s / n for group, s in spent.items()}
    return {"rate": result["rate"], "enqueue_rate": result["enqueue_rate"], **costs}


def statements_per_job(run: Run, n: int) -> float | None:
    """Postgres statements per job, from the server's statement log (embedded only)."""
    from bench import jobs
    from bench.fig_jobs import _set_statement_log, keel_batch

    log_path = run.env.postgres_log()
    if log_path is None:
        return None
    poller = psycopg.connect(os.environ["KEEL_DATABASE_URL"], autocommit=True)
    client = redis.Redis.from_url(os.environ["KEEL_REDIS_URL"])
    meter = RoundTrips(client, log_path, _set_statement_log, exclude_pids=set())
    with meter:
        _, cleanup = keel_batch(run, jobs.NOOP, n, None)
    cleanup()
    poller.close()
    assert meter.postgres is not None
    return meter.postgres / n


def _median(samples: list[dict[str, Any]], *path: str) -> float:
    def get(sample: dict[str, Any]) -> float:
        value: Any = sample
        for key in path:
            value = value.get(key, 0.0) if isinstance(value, dict) else 0.0
        return float(value)

    return median(get(s) for s in samples)


def summary(samples: list[dict[str, Any]], statements: float | None) -> dict[str, Any]:
    """Medians per job over the measured batches."""
    keys = ("rate", "commits", "inserted", "updated", "deleted", "wal_bytes", "wal_records")
    out: dict[str, Any] = {key: _median(samples, key) for key in keys}
    out["wal_fpi"] = _median(samples, "wal_fpi")
    out["redis_requests"] = _median(samples, "redis_requests")
    out["redis_commands_total"] = _median(samples, "redis_commands_total")
    names = sorted({name for s in samples for name in s["redis_commands"]})
    out["redis_commands"] = {name: _median(samples, "redis_commands", name) for name in names}
    out["statements"] = statements
    groups = sorted({g for s in samples for g in s["cpu_ms"]})
    out["cpu_ms"] = {group: _median(samples, "cpu_ms", group) for group in groups}
    redis_server = _median(samples, "redis_cpu_ms")
    out["cpu_ms"]["redis (INFO)"] = redis_server
    return out


def ceilings(costs: dict[str, Any]) -> dict[str, Any]:
    """Jobs/s each part's CPU allows (linear in cores: an upper bound), and what it then needs."""
    cpu = costs["cpu_ms"]
    pg_ms = cpu.get("postgres")
    redis_ms = cpu.get("redis (INFO)") or cpu.get("redis")
    worker_ms = cpu.get("worker", 0.0)
    producer_ms = cpu.get("bench process", 0.0)
    out: dict[str, Any] = {"redis_jobs_s": 1000 / redis_ms if redis_ms else None, "postgres": {}}
    for cores in CORES:
        rate = 1000 * cores / pg_ms if pg_ms else None
        out["postgres"][cores] = {
            "jobs_s": rate,
            "commits_s": rate * costs["commits"] if rate else None,
            "wal_mb_s": rate * costs["wal_bytes"] / 1e6 if rate else None,
        }
    out["worker_cores_per_1000_jobs_s"] = worker_ms  # ms of CPU per job = cores per 1,000/s
    out["producer_cores_per_1000_jobs_s"] = producer_ms
    return out


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def markdown(costs: dict[str, Any], limits: dict[str, Any], meta: dict[str, Any]) -> str:
    cpu = costs["cpu_ms"]
    lines = [
        f"## Capacity: cost of one no-op job ({meta['jobs']:,} jobs a batch, "
        f"median of {meta['runs']})",
        "",
        f"Commit {meta['commit']}, {meta['started']}, {meta['cpus']} CPUs, load average "
        f"{meta['loadavg']}. Servers: {meta['servers']}. Batch rate "
        f"{costs['rate']:.0f} jobs/s.",
        "",
        "| Per job | Value |",
        "| --- | --- |",
        f"| Postgres statements | {_f(costs['statements'])} |",
        f"| Postgres commits | {_f(costs['commits'])} |",
        f"| rows inserted / updated / deleted | {_f(costs['inserted'])} / "
        f"{_f(costs['updated'])} / {_f(costs['deleted'])} |",
        f"| WAL bytes (records, full-page images) | {_f(costs['wal_bytes'], 0)} "
        f"({_f(costs['wal_records'], 1)}, {_f(costs['wal_fpi'], 2)}) |",
        f"| Postgres server CPU | {_f(cpu.get('postgres'))} ms |",
        f"| Redis requests (round trips) | {_f(costs['redis_requests'])} |",
        f"| Redis commands | {_f(costs['redis_commands_total'])}: "
        + ", ".join(f"{k} {v:.2f}" for k, v in costs["redis_commands"].items())
        + " |",
        f"| Redis server CPU | {_f(cpu.get('redis (INFO)'), 3)} ms |",
        f"| worker tree CPU | {_f(cpu.get('worker'))} ms |",
        f"| producer CPU (`add`) | {_f(cpu.get('bench process'))} ms |",
        "",
        "| Ceiling from CPU alone | 8 cores | 32 cores | 64 cores |",
        "| --- | --- | --- | --- |",
    ]
    pg = limits["postgres"]
    lines.append(
        "| one Postgres primary, jobs/s | "
        + " | ".join(_f(pg[c]["jobs_s"], 0) for c in CORES)
        + " |"
    )
    lines.append(
        "| ... its commits/s | " + " | ".join(_f(pg[c]["commits_s"], 0) for c in CORES) + " |"
    )
    lines.append(
        "| ... its WAL, MB/s | " + " | ".join(_f(pg[c]["wal_mb_s"], 1) for c in CORES) + " |"
    )
    redis_rate = _f(limits["redis_jobs_s"], 0)
    lines.append(f"| one Redis (one core), jobs/s | {redis_rate} | {redis_rate} | {redis_rate} |")
    lines.append(
        "| worker cores for those Postgres rates | "
        + " | ".join(
            _f(pg[c]["jobs_s"] * limits["worker_cores_per_1000_jobs_s"] / 1000, 0)
            if pg[c]["jobs_s"]
            else "n/a"
            for c in CORES
        )
        + " |"
    )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=2000, help="no-op jobs per batch")
    parser.add_argument("--runs", type=int, default=3, help="measured batches")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    env = BenchEnv()
    started = datetime.now(UTC)
    try:
        env.start()
        # Imported once the servers are up: these modules read Keel's settings.
        from bench import jobs
        from bench.fig_jobs import keel_batch
        from bench.procs import CeleryWorker

        run = Run(env=env, sizes=QUICK, repeat=args.runs, quick=False)
        counters = ServerCounters(os.environ["KEEL_DATABASE_URL"], os.environ["KEEL_REDIS_URL"])
        samples = []
        with CeleryWorker(env, "keel-capacity", "tasks", 2, ["-I", "bench.jobs"]) as worker:
            keel_batch(run, jobs.NOOP, 200, None)[1]()  # warm-up
            for i in range(args.runs):
                log(f"batch {i + 1}/{args.runs}: {args.jobs} jobs")
                samples.append(measure(run, worker.pid, counters, args.jobs))
                log(f"  {samples[-1]['rate']:.0f} jobs/s")
            log("statement count: one more batch with the statement log on (untimed)")
            statements = statements_per_job(run, min(args.jobs, 1000))
        counters.close()
        meta = {
            "commit": measured_commit(),
            "started": started.isoformat(timespec="seconds"),
            "jobs": args.jobs,
            "runs": args.runs,
            "cpus": os.cpu_count(),
            "loadavg": "/".join(f"{x:.1f}" for x in os.getloadavg()),
            "servers": ", ".join(f"{k} {v}" for k, v in env.describe().items()),
        }
    finally:
        env.stop()
    costs = summary(samples, statements)
    limits = ceilings(costs)
    table = markdown(costs, limits, meta)
    print(table)
    report = {"meta": meta, "per_job": costs, "ceilings": limits, "samples": samples}
    log(f"wrote {write_report('capacity', report, table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
