"""P8: adding N jobs one ``add()`` at a time vs one ``add_bulk()`` (BullMQ's ``addBulk``).

Both record and publish the same no-op jobs on a queue no worker consumes,
alternating within each repetition; the jobs are deleted afterwards. The
figure is the add rate (jobs/s) of each and their ratio.
"""

from __future__ import annotations

import time

from sqlalchemy import text

from bench.plan import Run
from bench.stats import Figure, Series

TARGET = 10.0


def p8_bulk(run: Run) -> Figure:
    # Imported once the run's servers are in the environment (``BenchEnv.start``).
    from tasks.db import transaction
    from tasks.jobs import BulkJob, add, add_bulk

    fig = Figure("P8", "bulk add vs single adds", target=f"bulk >= {TARGET:.0f}x single adds")
    count = 1000 if run.quick else 10_000
    queue = f"{run.tag}-bulk"
    single, bulk = Series("single add()", "jobs/s"), Series("add_bulk()", "jobs/s")
    try:
        for _ in range(run.repeat):
            began = time.perf_counter()
            for i in range(count):
                add("bench.noop", {"i": i}, queue=queue)
            single.samples.append(count / (time.perf_counter() - began))
            began = time.perf_counter()
            add_bulk([BulkJob("bench.noop", {"i": i}, queue) for i in range(count)])
            bulk.samples.append(count / (time.perf_counter() - began))
            run.log(f"P8: single {single.samples[-1]:.0f}/s, bulk {bulk.samples[-1]:.0f}/s")
    finally:
        with transaction() as session:
            session.execute(text("DELETE FROM jobs WHERE queue = :q"), {"q": queue})
        _vacuum()  # the next figure starts from a table without 60,000 dead rows
    fig.series = [single, bulk]
    fig.ratio = bulk.median / single.median
    fig.ratio_text = "add_bulk / single adds (jobs/s)"
    fig.met = fig.ratio >= TARGET
    fig.notes.append(f"{count} jobs each way per repetition, alternating, same servers")
    return fig


def _vacuum() -> None:
    from tasks.db import engine
    from tasks.jobs.store import counts

    while counts.compact():
        pass
    with engine().connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE jobs"))
        conn.execute(text("VACUUM ANALYZE job_count_deltas"))
