"""P8: adding N jobs one ``add()`` at a time vs one ``add_bulk()`` (BullMQ's ``addBulk``).

Both record and publish the same no-op jobs on a queue no worker consumes,
alternating within each repetition, after a tenth of a repetition each way
unmeasured (as P1 warms its workers up); the jobs are deleted afterwards. The
figure is the CPU each costs per job, summed over every process that does
the work (the adding process, Postgres, Redis), and the add rate (jobs/s) of
each. Targets: a bulk add costs at most a tenth of a single add's CPU per job,
and adds at least 10,000 jobs/s.
"""

from __future__ import annotations

import time

from sqlalchemy import text

from bench.meters import CpuMeter
from bench.plan import Run
from bench.stats import Figure, Series

TARGET_CPU = 0.1  # bulk CPU per job / single adds' CPU per job, at most
TARGET_RATE = 10_000  # bulk jobs/s, at least


def p8_bulk(run: Run) -> Figure:
    # Imported once the run's servers are in the environment (``BenchEnv.start``).
    from tasks.jobs import BulkJob, add, add_bulk
    from tasks.platform.db import transaction

    fig = Figure(
        "P8",
        "bulk add vs single adds",
        target=f"bulk CPU per job <= {TARGET_CPU}x single adds' (all processes), "
        f"bulk >= {TARGET_RATE:,} jobs/s",
    )
    count = 1000 if run.quick else 10_000
    warmup = count // 10
    queue = f"{run.tag}-bulk"
    single_cpu = Series("single add() CPU per job", "ms")
    bulk_cpu = Series("add_bulk() CPU per job", "ms")
    single = Series("single add()", "jobs/s", chart=False)
    bulk = Series("add_bulk()", "jobs/s", chart=False)
    meter = CpuMeter(run.env.server_pids())  # and this process (``bench process``)
    try:
        # Unmeasured, as P1 warms its workers: each way's first use in this process
        for i in range(warmup):
            add("bench.noop", {"i": i}, queue=queue)
        add_bulk([BulkJob("bench.noop", {"i": i}, queue) for i in range(warmup)])
        for _ in range(run.repeat):
            before, began = meter.read(), time.perf_counter()
            for i in range(count):
                add("bench.noop", {"i": i}, queue=queue)
            single.samples.append(count / (time.perf_counter() - began))
            single_cpu.samples.append(_per_job_ms(meter, before, count))
            before, began = meter.read(), time.perf_counter()
            add_bulk([BulkJob("bench.noop", {"i": i}, queue) for i in range(count)])
            bulk.samples.append(count / (time.perf_counter() - began))
            bulk_cpu.samples.append(_per_job_ms(meter, before, count))
            run.log(
                f"P8: single {single.samples[-1]:.0f}/s {single_cpu.samples[-1]:.3f} ms, "
                f"bulk {bulk.samples[-1]:.0f}/s {bulk_cpu.samples[-1]:.3f} ms"
            )
    finally:
        with transaction() as session:
            session.execute(text("DELETE FROM jobs WHERE queue = :q"), {"q": queue})
        _vacuum()  # the next figure starts from a table without 60,000 dead rows
    fig.series = [single_cpu, bulk_cpu, single, bulk]
    fig.ratio = bulk_cpu.median / single_cpu.median
    fig.ratio_text = "add_bulk / single adds (CPU per job)"
    fig.met = fig.ratio <= TARGET_CPU and bulk.median >= TARGET_RATE
    fig.notes.append(
        f"{count} jobs each way per repetition, alternating, after {warmup} each way "
        "unmeasured; same servers; CPU per job is "
        f"the adding process's, Postgres's and Redis's together; add_bulk / single adds in "
        f"jobs/s = {bulk.median / single.median:.1f}x"
    )
    return fig


def _per_job_ms(meter: CpuMeter, before: dict[str, float], count: int) -> float:
    return sum(CpuMeter.spent(before, meter.read()).values()) / count * 1000


def _vacuum() -> None:
    from tasks.jobs.store import counts
    from tasks.platform.db import engine

    while counts.compact():
        pass
    with engine().connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE jobs"))
        conn.execute(text("VACUUM ANALYZE job_count_deltas"))
