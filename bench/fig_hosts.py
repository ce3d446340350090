"""P7 (no-op jobs on 1, then 2 worker hosts): what a second worker host adds, and what stops it.

P1's shape on separate hosts (network namespaces on this machine, see
``tests/support/netns.py``): the ``db`` host runs Postgres and Redis, a
``client`` host adds N no-op jobs from one thread, and one or two worker
hosts each run ``celery -A tasks worker -c 2``, fresh for every repetition,
on the same servers. The two settings alternate (1, 2, 1, 2, …).

Every host shares this machine's cores, so the figure is a shape, not a
target: what it shows is how much a second worker host adds here and which
part runs out first. Per setting it prints the CPU each part used (in cores:
CPU seconds over the batch's seconds) — Postgres, Redis, each worker host,
the producer — and how busy the whole machine was (other work included),
and names the bottleneck from those.

Needs root and ``ip netns``; without them the figure is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from statistics import median

import psutil

from bench.meters import CpuMeter
from bench.plan import Run
from bench.stats import Figure, Series, ratio

SETTINGS = (1, 2)  # worker hosts
LABELS = {1: "1 worker host", 2: "2 worker hosts"}
SATURATED = 0.85  # of a core (one thread), or of the machine


def _hosts(run: Run):
    from tests.support.multihost import KeelHosts

    return KeelHosts(
        workers=("w1", "w2"),
        start_workers=False,
        with_api=False,
        with_beat=False,
        worker_args=("-c", str(run.sizes.worker_concurrency), "-P", "prefork", "-I", "bench.jobs"),
    )


def _batch(run: Run, hosts, count: int) -> dict:
    """Fresh workers on ``count`` hosts, a warm-up, then one measured batch with its CPU."""
    names = ["w1", "w2"][:count]
    workers = [hosts.spawn_worker(name) for name in names]
    try:
        for worker in workers:
            worker.wait_for_log(" ready.")
        roots = {
            "postgres": hosts.postgres.process.pid,
            "redis": hosts.redis.process.pid,
            **{name: w.pid for name, w in zip(names, workers, strict=True)},
        }
        return _measure(run, hosts, CpuMeter(roots))
    finally:
        for worker in workers:
            worker.stop()


def _measure(run: Run, hosts, meter: CpuMeter) -> dict:
    argv = ["-m", "bench.producer", str(run.sizes.noop_jobs), str(run.sizes.warmup_jobs)]
    producer = subprocess.Popen(
        hosts.network["client"].command([sys.executable, *argv]),
        env=hosts.env("client"),
        cwd=hosts.home("client"),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    limit = 120 + run.sizes.noop_jobs / 10  # the producer's own deadline, and its start-up
    try:
        if _line(producer, limit) != "ready":
            raise RuntimeError(f"the producer did not start (exit {producer.poll()})")
        before, machine = meter.read(), psutil.cpu_times()
        producer.stdin.write("go\n")
        producer.stdin.flush()
        line = _line(producer, limit)
        spent, machine_after = CpuMeter.spent(before, meter.read()), psutil.cpu_times()
        if not line:
            raise RuntimeError(f"the producer failed (exit {producer.poll()})")
        result = json.loads(line)
    finally:
        producer.kill()
        producer.wait()
    spent.pop("bench process", None)
    spent["producer"] = result["cpu_s"]
    result["cores"] = {group: s / result["seconds"] for group, s in spent.items()}
    result["machine_busy"] = _busy(machine, machine_after)
    return result


def _line(process: subprocess.Popen, timeout: float) -> str:
    """The next line ``process`` prints, or "" if it prints none within ``timeout`` s."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline().strip()


def _busy(before, after) -> float:
    """Share of the machine's CPU time that was not idle between two readings."""
    idle = (after.idle + getattr(after, "iowait", 0)) - (before.idle + getattr(before, "iowait", 0))
    total = sum(after) - sum(before)
    return 1 - idle / total if total > 0 else float("nan")


def bottleneck(cores: dict[str, float], machine_busy: float) -> str:
    """Which part ran out first, from the cores each used and how busy the machine was."""
    top = max(cores, key=cores.get)
    if machine_busy >= SATURATED:
        return (
            f"the machine's CPU ({machine_busy:.0%} of {os.cpu_count()} cores busy, other "
            f"work included): every host shares the same cores, so another worker host "
            f"only splits them; the largest share is {top} ({cores[top]:.2f} cores)"
        )
    for part in ("producer", "postgres", "redis"):
        if cores.get(part, 0) >= SATURATED:
            return f"{part} ({cores[part]:.2f} cores: a single process near one core)"
    return f"no part saturated; {top} used the most ({cores[top]:.2f} cores)"


def p7_hosts(run: Run) -> Figure:
    from tests.support.netns import unavailable_reason

    fig = Figure(
        "P7",
        "No-op jobs on 1 and 2 worker hosts",
        target="more jobs/s with 2 worker hosts (a shape, not a fixed ratio)",
    )
    reason = unavailable_reason()
    if reason:
        run.log(f"P7 skipped: {reason}")
        fig.skipped = reason
        return fig
    rates = {count: Series(LABELS[count], "jobs/s") for count in SETTINGS}
    checks: list[dict] = []
    hosts = _hosts(run)
    try:
        hosts.start()
        for rep in range(run.repeat):
            for count in SETTINGS:
                run.log(
                    f"P7 rep {rep + 1}/{run.repeat}: {LABELS[count]}, {run.sizes.noop_jobs} jobs"
                )
                result = _batch(run, hosts, count)
                rates[count].samples.append(result["rate"])
                checks.append({"worker_hosts": count, "rep": rep, **result})
                run.log(f"  {result['rate']:.0f} jobs/s; " + _cpu_line(result))
    finally:
        hosts.stop()
    _summarize(fig, rates, checks)
    return fig


def _cpu_line(result: dict) -> str:
    cores = ", ".join(f"{part} {used:.2f}" for part, used in result["cores"].items())
    return f"CPU in cores: {cores}; machine {result['machine_busy']:.0%} busy"


def _summarize(fig: Figure, rates: dict[int, Series], checks: list[dict]) -> None:
    fig.series = list(rates.values())
    fig.ratio = ratio(rates[2], rates[1])
    fig.ratio_text = "2 worker hosts / 1 worker host (jobs/s)"
    fig.met = fig.ratio > 1.0
    fig.details = {"runs": checks}
    for count in SETTINGS:
        mine = [c for c in checks if c["worker_hosts"] == count]
        cores = {part: median(c["cores"][part] for c in mine) for part in mine[0]["cores"]}
        busy = median(c["machine_busy"] for c in mine)
        fig.notes.append(
            f"{LABELS[count]}: servers' CPU postgres {cores['postgres']:.2f} cores, "
            f"redis {cores['redis']:.2f}; all of Keel's parts "
            f"{sum(cores.values()):.2f} of {os.cpu_count()} cores, the machine "
            f"{busy:.0%} busy; bottleneck: {bottleneck(cores, busy)}"
        )
