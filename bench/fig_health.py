"""P5: queue health over many job records — the counters, their HTTP endpoint, and a full scan.

Records are bulk-loaded with ``INSERT ... SELECT generate_series`` (100,000
rows a statement, each well inside a worker's round-trip deadline) in mixed
states; the insert fires Keel's trigger like any other, and
``counts.compact()`` folds the deltas as the promoter would. The full-scan
``GROUP BY`` is the reference the counters exist to avoid, and the check
that they are right: the figure is an error if the two disagree.
"""

from __future__ import annotations

import os
import time

import requests
from sqlalchemy import text

from bench.plan import Run
from bench.procs import gunicorn
from bench.stats import Figure, Series, percentile

QUEUE = "reports"
NAME = "bench.p5"
LATENCY_TARGET_MS = 50
LOAD_CHUNK = 100_000
# Ten slots: half completed, the rest spread over the other states.
STATES = ["completed"] * 5 + ["failed", "waiting", "waiting", "delayed", "active"]

_LOAD = text(
    """
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, attempts_made,
                      attempts_started, processed_on, finished_on, run_at, lock_token, locked_until)
    SELECT :prefix || g, :queue, :name,
           jsonb_build_object('reportId', 'r' || g, 'rows', 100), '{"attempts": 4}'::jsonb,
           :tenant, 'bench-user', s.state,
           CASE WHEN s.state = 'failed' THEN 4 ELSE 0 END,
           CASE WHEN s.state IN ('waiting', 'delayed') THEN 0 ELSE 1 END,
           CASE WHEN s.state IN ('waiting', 'delayed') THEN NULL ELSE now() END,
           CASE WHEN s.state IN ('completed', 'failed')
                THEN now() - make_interval(secs => g / 1000.0) END,
           CASE WHEN s.state = 'delayed' THEN now() + interval '1 day' END,
           CASE WHEN s.state = 'active' THEN md5(g::text) END,
           CASE WHEN s.state = 'active' THEN now() + interval '1 day' END
    FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    CROSS JOIN LATERAL (SELECT (CAST(:states AS text[]))[1 + g % 10] AS state) AS s
    """
)
_NAIVE = text("SELECT state, count(*) FROM jobs WHERE queue = :q GROUP BY state")
_DEAD = text(
    "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'job_count_deltas'"
)


def delta_tuples() -> dict[str, int]:
    """Live and dead rows of the delta table: dead index entries are what readers wade through."""
    from tasks.platform.db import transaction

    with transaction() as session:
        live, dead = session.execute(_DEAD).one()
    return {"live": int(live), "dead": int(dead)}


def vacuum_deltas() -> None:
    from tasks.platform.db import engine

    with engine().connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM job_count_deltas"))


def load_records(run: Run, n: int) -> float:
    """Insert ``n`` records and fold their deltas; seconds taken."""
    from tasks.jobs.store import counts
    from tasks.platform.db import transaction

    began = time.perf_counter()
    for first in range(1, n + 1, LOAD_CHUNK):
        with transaction() as session:
            session.execute(
                _LOAD,
                {
                    "prefix": f"{run.tag}-p5-",
                    "queue": QUEUE,
                    "name": NAME,
                    "tenant": run.tag,
                    "first": first,
                    "last": min(n, first + LOAD_CHUNK - 1),
                    "states": STATES,
                },
            )
    while counts.compact():
        pass
    with transaction() as session:
        session.execute(text("ANALYZE jobs"))
    return time.perf_counter() - began


def remove_records(run: Run) -> None:
    from tasks.jobs.store import counts
    from tasks.platform.db import transaction

    with transaction() as session:
        session.execute(
            text("DELETE FROM jobs WHERE tenant_id = :t AND name = :n"), {"t": run.tag, "n": NAME}
        )
    while counts.compact():
        pass


def timed_ms(call: object, times: int) -> list[float]:
    out = []
    for _ in range(times):
        began = time.perf_counter()
        call()  # type: ignore[operator]
        out.append((time.perf_counter() - began) * 1000)
    return out


def p5_health(run: Run) -> Figure:
    from tasks.jobs.observe.queue_counts import counts
    from tasks.platform.db import transaction
    from web.tokens import issue_token

    sizes = run.sizes
    fig = Figure(
        "P5",
        f"Queue health over {sizes.records:,} job records",
        target=f"p99 ≤ {LATENCY_TARGET_MS} ms (counts() and the endpoint)",
    )
    run.log(f"P5: loading {sizes.records:,} records")
    load_s = load_records(run, sizes.records)
    token = issue_token(os.environ["KEEL_SECRET_KEY"], run.tag, "bench-op", ["operator"], 3600)
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {token}"

    def naive() -> dict[str, int]:
        with transaction() as session:
            return {state: int(n) for state, n in session.execute(_NAIVE, {"q": QUEUE}).all()}

    names = (
        "counts() p50",
        "counts() p99",
        "HTTP p50",
        "HTTP p99",
        "full scan p50",
        "counts() p50 after VACUUM",
        "counts() p99 after VACUUM",
    )
    charted = {"counts() p99", "counts() p99 after VACUUM", "HTTP p99", "full scan p50"}
    series = {name: Series(name, "ms", chart=name in charted) for name in names}
    runs: list[dict] = []
    server = gunicorn(run.env, sizes.http_workers)
    with server:
        url = server.url + "/api/v1/reports/queue/health"
        for rep in range(run.repeat):
            dead = delta_tuples()
            run.log(f"P5 rep {rep + 1}/{run.repeat}: counts(), HTTP, full scan ({dead})")
            direct = timed_ms(lambda: counts(QUEUE), sizes.health_calls)
            over_http = timed_ms(
                lambda: http.get(url, timeout=10).raise_for_status(), sizes.health_calls
            )
            scan = timed_ms(naive, sizes.naive_calls)
            for name, values in (("counts()", direct), ("HTTP", over_http)):
                series[f"{name} p50"].samples.append(percentile(values, 50))
                series[f"{name} p99"].samples.append(percentile(values, 99))
            series["full scan p50"].samples.append(percentile(scan, 50))
            runs.append(
                {
                    "rep": rep,
                    "delta_tuples": dead,
                    "counts_ms": direct,
                    "http_ms": over_http,
                    "scan_ms": scan,
                }
            )
        fast, truth = counts(QUEUE), naive()
        run.log("P5: VACUUM job_count_deltas, then counts() again")
        vacuum_deltas()
        for _ in range(run.repeat):
            clean = timed_ms(lambda: counts(QUEUE), sizes.health_calls)
            series["counts() p50 after VACUUM"].samples.append(percentile(clean, 50))
            series["counts() p99 after VACUUM"].samples.append(percentile(clean, 99))
        shown = http.get(url, timeout=10).json()
    remove_records(run)
    if any(fast[state] != truth.get(state, 0) for state in fast):
        fig.error = f"counts() {fast} disagree with a full scan {truth}"
    fig.series = list(series.values())
    fig.ratio = series["full scan p50"].median / series["counts() p50"].median
    fig.ratio_text = "full scan p50 / counts() p50 (how much the counters save)"
    worst = max(series["counts() p99"].median, series["HTTP p99"].median)
    fig.met = worst <= LATENCY_TARGET_MS
    fig.details = {
        "records": sizes.records,
        "load_seconds": load_s,
        "counts": fast,
        "endpoint": shown,
        "calls": sizes.health_calls,
        "runs": runs,
    }
    fig.notes.append(
        "measured right after load + compact(); job_count_deltas then holds up to one dead "
        "row per folded delta until (auto)vacuum, and counts() wades through them (live/dead "
        "rows per repetition in the JSON); the 'after VACUUM' rows are the same call once "
        "they are gone, measured after the alternating repetitions"
    )
    fig.notes.append(
        f"{sizes.records:,} records loaded and compacted in {load_s:.1f}s; "
        "HTTP through gunicorn with an operator token, one connection"
    )
    return fig
