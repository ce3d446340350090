"""P10: P1's no-op jobs on grown tables, and queue health there.

Users keep millions of finished records (audit, results): a queue whose jobs slow
down as its tables grow fails in month three, not in a benchmark. Two scratch
databases on the bench's Postgres, loaded by ``bench.growth``'s loader:

- *empty*: the live set alone (1,000 waiting jobs, 100 active, on other queues);
- *grown*: the same, plus 10,000,000 finished records spread over 30 days (80%
  completed, 15% failed, 5% cancelled, over 20 queues and 1,000 tenants) and
  100,000 delayed jobs due later (``--quick``: 100,000 and 1,000).

Each repetition runs P1's Keel side (a fresh warmed-up ``celery -A tasks worker``,
N no-op jobs added from one thread, timed to the last one finished) on the empty
database, then on the grown one, with the CPU each cost per job (worker, Postgres,
Redis, the adding process). Retention is off in both (``KEEL_KEEP_*_S=0``: the
records are kept, as by a user who keeps them). Then ``counts()`` of a queue
holding 500,000 of the records, ``health_calls`` times on each database, and as
many searches by a data field (``list_jobs`` with ``data=reportId=r-<n>`` in the
record's tenant: what ``GET /api/v1/jobs?data.reportId=…`` runs), each for a record
drawn at random from the grown table (on the empty one, it finds none).

Before the first repetition the server finishes what the load left it (``growth.quiet``:
a ``CHECKPOINT``, then no autovacuum worker for 5 s), as a database that grew over
months would be.

Targets: grown/empty ≥ 0.9 in jobs/s; ``counts()`` p99 ≤ 50 ms and a data search's
p99 ≤ 100 ms on the grown one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

from bench import growth, jobs
from bench.fig_health import timed_ms
from bench.fig_jobs import keel_batch, measured
from bench.plan import Run
from bench.procs import CeleryWorker
from bench.stats import Figure, Series, percentile, ratio

RATE_TARGET = 0.9
HEALTH_P99_MS = 50.0
SEARCH_P99_MS = 100.0
RECORDS, DELAYED = 10_000_000, 100_000
QUICK_RECORDS, QUICK_DELAYED = 100_000, 1_000
KEPT = {"KEEL_KEEP_COMPLETED_S": "0", "KEEL_KEEP_FAILED_S": "0"}


def searches(run: Run) -> list[Callable[[], object]]:
    """``health_calls`` data searches, each for a record of the grown table drawn at random
    (its tenant, its ``reportId``), as the API's listing runs them."""
    from sqlalchemy import text

    from tasks.jobs.model.search import parse
    from tasks.jobs.observe.queries import JobFilter, list_jobs
    from tasks.platform.db import transaction

    with transaction() as session:
        drawn = session.execute(
            text(
                "SELECT tenant_id, data->>'reportId' FROM jobs TABLESAMPLE SYSTEM (1) "
                "WHERE data ? 'reportId' LIMIT :n"
            ),
            {"n": run.sizes.health_calls},
        ).all()
    return [
        partial(list_jobs, JobFilter(tenant_id=tenant, data=parse(f"reportId={report}")))
        for tenant, report in drawn
    ]


def p10_grown(run: Run) -> Figure:
    from tasks.jobs.observe.queue_counts import counts

    records, delayed = (QUICK_RECORDS, QUICK_DELAYED) if run.quick else (RECORDS, DELAYED)
    fig = Figure(
        "P10",
        "no-op jobs on grown tables",
        target=f"grown ≥ {RATE_TARGET}x empty (jobs/s) with {records:,} retained records; "
        f"counts() p99 ≤ {HEALTH_P99_MS:.0f} ms there; a data search's p99 ≤ "
        f"{SEARCH_P99_MS:.0f} ms there",
    )
    own_url = os.environ["KEEL_DATABASE_URL"]
    scratch = growth.Scratch.on(own_url)
    n = run.sizes.noop_jobs
    rates = {which: Series(f"Keel, {which} tables", "jobs/s") for which in ("empty", "grown")}
    cpu = {
        which: Series(f"Keel CPU per job, {which} tables", "ms", chart=False)
        for which in ("empty", "grown")
    }
    health = {
        which: Series(f"counts() p99, {which} tables", "ms", chart=False)
        for which in ("empty", "grown")
    }
    searched = {
        which: Series(f"data search p99, {which} tables", "ms", chart=False)
        for which in ("empty", "grown")
    }
    try:
        scratch.create()
        loaded: dict[str, dict[str, float]] = {}
        for which, (r, d) in (("empty", (0, 0)), ("grown", (records, delayed))):
            run.log(f"P10: loading the {which} database ({r:,} records, {d:,} delayed)")
            growth.migrate(scratch.url(which))
            loaded[which] = growth.populate(scratch.url(which), r, d)
        fig.details["load_s"] = loaded
        fig.details["table"] = growth.table_size()  # the grown one, loaded last
        # As a database that grew over months: its pages written out, no vacuum running
        # (the load leaves the server busy for minutes: both sides ran at a third of P1's rate)
        settled = growth.quiet(scratch.url("grown"))
        fig.details["quiet"] = settled
        run.log(f"P10: server settled after the load: {settled}")
        growth.use_database(scratch.url("grown"))
        drawn = searches(run)  # the same records searched on both databases
        for rep in range(run.repeat):
            for which in ("empty", "grown"):  # A, B, A, B, ...
                url = scratch.url(which)
                growth.use_database(url)
                run.log(f"P10 rep {rep + 1}/{run.repeat}: Keel on {which} tables, {n} jobs")
                worker = CeleryWorker(
                    run.env,
                    f"keel-{which}",
                    "tasks",
                    run.sizes.worker_concurrency,
                    ["-I", "bench.jobs"],
                    extra_env={"KEEL_DATABASE_URL": url, **KEPT},
                )
                result = measured(run, worker, n, lambda k: keel_batch(run, jobs.NOOP, k, None))
                rates[which].samples.append(result["rate"])
                cpu[which].samples.append(result["cpu_ms_per_job_total"])
                calls = timed_ms(lambda: counts(growth.queue_name(0)), run.sizes.health_calls)
                health[which].samples.append(percentile(calls, 99))
                found = [timed_ms(search, 1)[0] for search in drawn]
                searched[which].samples.append(percentile(found, 99))
                run.log(
                    f"  {which}: {result['rate']:.0f} jobs/s, "
                    f"{result['cpu_ms_per_job_total']:.1f} CPU ms/job, "
                    f"counts() p99 {health[which].samples[-1]:.1f} ms, "
                    f"data search p99 {searched[which].samples[-1]:.1f} ms"
                )
    finally:
        growth.use_database(own_url)
        scratch.drop()
    fig.series = [*rates.values(), *cpu.values(), *health.values(), *searched.values()]
    fig.ratio = ratio(rates["grown"], rates["empty"])
    fig.ratio_text = "grown / empty tables (jobs/s)"
    fig.met = (
        fig.ratio >= RATE_TARGET
        and health["grown"].median <= HEALTH_P99_MS
        and searched["grown"].median <= SEARCH_P99_MS
    )
    fig.notes.append(
        f"{n} jobs per repetition on each database, alternating; grown: {records:,} finished "
        f"records and {delayed:,} delayed jobs besides the live set, retention off; CPU per "
        f"job grown/empty = {ratio(cpu['grown'], cpu['empty']):.2f}x; load took "
        f"{loaded['grown']['total']:.0f} s"
    )
    fig.notes.append(
        f"measured once the server was quiet after the load: CHECKPOINT "
        f"{settled['checkpoint']} ({settled['checkpoint_s']:.0f} s), no autovacuum worker "
        f"for 5 s {'reached' if settled['quiet'] else 'NOT reached'} after "
        f"{settled['waited_s']:.0f} s"
    )
    return fig
