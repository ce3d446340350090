"""``python -m bench [--quick] [--only P1,P3] [--repeat 3] [--results-dir DIR]``.

Starts what it needs, runs the selected figures (each pair alternating A, B,
A, B, …), and writes ``<UTC timestamp>.json``, ``.md``, ``.png`` and
``latest.md`` to ``bench/results/``. Exit status 1 if a figure could not be
measured; a missed target is a result, not an error.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import import_module
from pathlib import Path

from bench.env import PROJECT_ROOT, BenchEnv
from bench.plan import FULL, QUICK, Run
from bench.report import RESULTS_DIR, write
from bench.stats import Figure

TITLES = {
    "P1": "no-op jobs",
    "P2": "fail once then succeed",
    "P3": "POST /reports under load",
    "P4": "campaign vs raw provider loop",
    "P5": "queue health",
    "P6": "CLI start-up",
    "P7": "no-op jobs on 1 and 2 worker hosts",
    "P8": "bulk add vs single adds",
    "P9": "callers waiting on AsyncResult.get()",
    "P10": "no-op jobs on grown tables",
    "P11": "pickup latency, add → start",
    "P12": "the API beside 1,000 slow request heads",
}
# Figures with workers first; the API figures leave queued messages nobody consumes.
ORDER = ("P6", "P8", "P1", "P2", "P9", "P11", "P7", "P4", "P5", "P3", "P12", "P10")
# Figures that start servers of their own (on separate hosts): they need no BenchEnv.
OWN_SERVERS = {"P7"}


RUNNERS = {
    "P1": "fig_jobs:p1_noop",
    "P2": "fig_jobs:p2_retry",
    "P3": "fig_http:p3_http",
    "P4": "fig_campaign:p4_campaign",
    "P5": "fig_health:p5_health",
    "P6": "fig_cli:p6_cli",
    "P7": "fig_hosts:p7_hosts",
    "P8": "fig_bulk:p8_bulk",
    "P9": "fig_results:p9_waiting",
    "P10": "fig_grown:p10_grown",
    "P11": "fig_pickup:p11_pickup",
    "P12": "fig_slow_heads:p12_slow_heads",
}


def runner(key: str) -> Callable[[Run], Figure]:
    """Imported only now: the figure modules read settings the environment has just set."""
    module, function = RUNNERS[key].split(":")
    return getattr(import_module(f"bench.{module}"), function)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Keel beside bare Celery, the provider's raw rate and a trivial endpoint; "
        "writes JSON, Markdown and a PNG chart.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    parser.add_argument(
        "--only",
        default=",".join(sorted(TITLES)),
        help="comma-separated figures, e.g. P1,P3 (default: all)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure (3)")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help="where to write the results (default bench/results)",
    )
    args = parser.parse_args(argv)
    args.only = [key.strip().upper() for key in args.only.split(",") if key.strip()]
    unknown = sorted(set(args.only) - set(TITLES))
    if unknown or not args.only:
        parser.error(f"unknown figures {unknown}; choose from {', '.join(sorted(TITLES))}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "tasks", "web"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def meta_of(args: argparse.Namespace, env: BenchEnv, argv: list[str]) -> dict:
    return {
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python -m bench", *argv]),
        "quick": args.quick,
        "repeat": args.repeat,
        "figures": args.only,
        "sizes": (QUICK if args.quick else FULL).__dict__,
        "git": _git_commit(),
        "servers": env.describe(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_start": os.getloadavg(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    env = BenchEnv()
    meta = meta_of(args, env, argv)
    figures: list[Figure] = []
    began = time.monotonic()
    try:
        if set(args.only) - OWN_SERVERS:
            env.start()
        run = Run(
            env=env, sizes=QUICK if args.quick else FULL, repeat=args.repeat, quick=args.quick
        )
        for key in [k for k in ORDER if k in args.only]:
            run.log(f"{key}: {TITLES[key]}")
            try:
                figures.append(runner(key)(run))
            except Exception as exc:  # keep the other figures; say loudly what broke
                traceback.print_exc()
                figures.append(Figure(key, TITLES[key], error=f"{type(exc).__name__}: {exc}"))
    finally:
        env.stop()
    figures.sort(key=lambda f: f.key)
    meta["seconds"] = round(time.monotonic() - began, 1)
    meta["machine"]["loadavg_end"] = os.getloadavg()
    paths = write(meta, figures, args.results_dir)
    print("\n" + paths["md"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if any(f.error for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
