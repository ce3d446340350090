"""Growth: how Keel's hot-path statements behave as the ``jobs`` table grows.

"A Postgres queue that slows as its tables grow fails in month three." This
measures the statements sent on every job, every maintenance tick and every
API or metrics read, on two scratch databases migrated to Keel's schema on the
server of ``--database-url``:

- *empty*: only a small live set (1,000 waiting jobs, 100 active);
- *grown*: the same live set, plus ``--records`` finished records spread over
  the last 30 days (80% completed, 15% failed, 5% cancelled, over 20 queues,
  1,000 tenants and 4 users each) and ``--delayed`` delayed jobs, due over a
  day that starts two hours after their load (a promoter tick finds none due,
  as when it keeps up).

Records are bulk-loaded with ``INSERT ... SELECT generate_series``, 100,000
rows a statement, each its own transaction (as ``bench.fig_health``), through
Keel's count trigger; the deltas are folded (``counts.compact``), and the
tables vacuumed and analysed.

Each statement is Keel's own: the function that sends it (``runs.claim``,
``upkeep.promote_due``, ``queries.list_jobs``, ...) is called with fresh targets
(a waiting job to claim, an active job and its lock token, a tenant, ...), and
its first statement is captured before it reaches the server. The captured SQL
and parameters then run under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` in a
transaction that is rolled back, so every run sees the same data. Per statement
and database, over ``--runs`` runs after one warm-up: p50 and p99 server
execution time, shared buffers hit + read, rows returned (or modified), rows
read and thrown away by a filter (a condition no index could take), the plan's
top node, how it reaches ``jobs`` and whether by a sequential scan; grown/empty
of the p50 flags a statement whose cost follows the table's size. (The add
against a quota runs ``keel_admit_job``, whose own queries EXPLAIN does not show.) Statements run in
turn on both databases (empty, then grown) with the same targets.

    python -m bench.growth --database-url postgresql://postgres@127.0.0.1:5432/postgres \\
        [--records 10000000] [--delayed 100000] [--runs 20] [--keep]

Prints a Markdown table and writes it, and the JSON with every plan, to
``bench/results/growth-<UTC timestamp>.md`` / ``.json``.
The scratch databases (``keel_growth_<random>`` and ``..._empty``) are dropped at
the end unless ``--keep``; nothing else on the server is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
from sqlalchemy import TextClause, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

# Keel's modules read their settings (the database URL) when first used, not when
# imported: ``use_database`` points them at one scratch database, then the other.
from bench.report import log, measured_commit, write_report
from bench.stats import percentile
from tasks.jobs.intake import tenancy
from tasks.jobs.model.models import State
from tasks.jobs.model.options import JobOptions
from tasks.jobs.observe import queries
from tasks.jobs.observe.queries import JobFilter
from tasks.jobs.store import admission, counts, runs, upkeep
from tasks.jobs.store import jobs as store
from tasks.jobs.upkeep import retention
from tasks.platform import db
from tasks.platform.config import get_settings, reload_settings

PROJECT_ROOT = Path(__file__).resolve().parents[1]

LOAD_CHUNK = 100_000
QUEUES, TENANTS, USERS = 20, 1_000, 4
WAITING, ACTIVE = 1_000, 100
STATE_MIX = ["completed"] * 16 + ["failed"] * 3 + ["cancelled"]  # 80 / 15 / 5 %
WARMUP = 1
DELAYED_LEAD_S = 2 * 3600  # none due while measuring, as when the promoter keeps up
SWEEP_INTERVAL_S = 60  # KEEL_RETENTION_INTERVAL_S: a sweep takes one interval's expired records
WORKER, LOCK_S = "celery@bench-growth", 30.0
OWN_RULE = {State.COMPLETED: "removeOnComplete", State.FAILED: "removeOnFail"}


# --- scratch databases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Scratch:
    """The two scratch databases on the server of a URL: grown and empty."""

    server: URL
    name: str = field(default_factory=lambda: f"keel_growth_{secrets.token_hex(4)}")

    @classmethod
    def on(cls, url: str) -> Scratch:
        return cls(make_url(url).set(drivername="postgresql"))

    @property
    def names(self) -> dict[str, str]:
        return {"empty": f"{self.name}_empty", "grown": self.name}

    def url(self, which: str) -> str:
        return self.server.set(database=self.names[which]).render_as_string(hide_password=False)

    def _admin(self, statement: str) -> None:
        server = self.server.render_as_string(hide_password=False)
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute(statement)

    def create(self) -> None:
        for name in self.names.values():
            self._admin(f'CREATE DATABASE "{name}"')

    def drop(self) -> None:
        db.dispose()
        for name in self.names.values():
            try:
                self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except psycopg.Error as error:  # say so, and let the first error (if any) show
                log(f"could not drop {name}: {error}")


def migrate(url: str) -> None:
    """Keel's schema at head (``keel db upgrade``), in a child process with its own settings."""
    code = "from tasks.platform.migrate import migrate; migrate()"
    env = {**os.environ, "KEEL_DATABASE_URL": url}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=PROJECT_ROOT, check=True)


def use_database(url: str) -> None:
    """Point this process's Keel (settings, engines) at ``url``, its pool opened."""
    os.environ["KEEL_DATABASE_URL"] = url
    reload_settings()
    db.dispose()
    with db.engine().connect() as connection:
        connection.exec_driver_sql("SELECT 1")


# --- loading ----------------------------------------------------------------------------------

# Whose a loaded row is, from a hash of its kind and number: its queue, tenant, one of the
# tenant's users and one of the queue's two job names (independent digits of the hash).
_WHO = f"""
    CROSS JOIN LATERAL (SELECT hashtext(CAST(:kind AS text) || g)::bigint + 2147483648 AS h)
        AS hashed
    CROSS JOIN LATERAL (SELECT
        'queue-' || lpad((h % {QUEUES})::text, 2, '0') AS queue,
        'tenant-' || lpad((h / {QUEUES} % {TENANTS})::text, 4, '0') AS tenant,
        'user-' || (h / {QUEUES * TENANTS} % {USERS}) AS user_id,
        'job.' || lpad((h % {QUEUES})::text, 2, '0') || '.' || (h / 7 % 2) AS name) AS who
"""
_ROWS = "FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g"
_ID = "md5(CAST(:kind AS text) || g)::uuid::text"
_DATA = """jsonb_build_object('reportId', 'r-' || g, 'rows', 100 + h % 900, 'format', 'csv',
    'filters', jsonb_build_object('region', 'eu-west-1', 'from', '2026-01-01',
                                  'to', '2026-01-31'))"""
_BASE = "CAST(:base AS timestamptz)"


def _iso(moment: str) -> str:
    return f"""to_char({moment} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def _run(started: str, outcome: str | None) -> str:
    """One run object, as a claim writes it (and its end, if ``outcome``)."""
    ended = f", 'outcome', {outcome}, 'finishedAt', {_iso('t.finished')}" if outcome else ""
    return (
        f"jsonb_build_array(jsonb_build_object('attempt', 1, 'startedAt', {_iso(started)}, "
        f"'worker', 'celery@worker-' || h % 8, 'pid', 1000 + h % 64{ended}))"
    )


# Finished records, in the order they finished: ``finished_on`` grows with g over the 30 days
# before the load, as a table filled over a month is laid out.
_FINISHED = text(
    f"""
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, attempts_made,
                      attempts_started, failed_reason, stacktrace, result, runs, created_at,
                      processed_on, finished_on)
    SELECT {_ID}, who.queue, who.name, {_DATA}, CAST(:opts AS jsonb), who.tenant, who.user_id,
           s.state, CASE s.state WHEN 'failed' THEN 3 ELSE 0 END,
           CASE s.state WHEN 'failed' THEN 3 WHEN 'completed' THEN 1 ELSE 0 END,
           CASE WHEN s.state = 'failed' THEN 'TimeoutError: the provider did not answer' END,
           CASE WHEN s.state = 'failed'
                THEN jsonb_build_array('Traceback (most recent call last): ...')
                ELSE '[]'::jsonb END,
           CASE WHEN s.state = 'completed'
                THEN jsonb_build_object('url', 's3://reports/r-' || g || '.csv') END,
           CASE WHEN s.state = 'cancelled' THEN '[]'::jsonb
                ELSE {_run("t.started", "s.state")} END,
           t.created, CASE WHEN s.state <> 'cancelled' THEN t.started END, t.finished
    {_ROWS}
    {_WHO}
    CROSS JOIN LATERAL (SELECT (CAST(:states AS text[]))[1 + g % 20] AS state) AS s
    CROSS JOIN LATERAL (SELECT {_BASE} - interval '30 days'
                               * (1 - g / CAST(:total AS float8)) AS finished) AS f
    CROSS JOIN LATERAL (SELECT f.finished, f.finished - make_interval(secs => 1 + h % 30)
                                   AS started,
                               f.finished - make_interval(secs => 31 + h % 600) AS created) AS t
    """
)
_DELAYED = text(
    f"""
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, created_at, run_at)
    SELECT {_ID}, who.queue, who.name, {_DATA}, CAST(:opts AS jsonb), who.tenant, who.user_id,
           'delayed', {_BASE} - make_interval(secs => h % 3600),
           {_BASE} + make_interval(secs => :lead_s)
               + interval '1 day' * (g / CAST(:total AS float8))
    {_ROWS}
    {_WHO}
    """
)
_WAITING = text(
    f"""
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, created_at)
    SELECT {_ID}, who.queue, who.name, {_DATA}, CAST(:opts AS jsonb), who.tenant, who.user_id,
           'waiting', {_BASE} - make_interval(secs => g)
    {_ROWS}
    {_WHO}
    """
)
_ACTIVE = text(
    f"""
    INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state, attempts_started,
                      created_at, processed_on, lock_token, locked_until, runs)
    SELECT {_ID}, who.queue, who.name, {_DATA}, CAST(:opts AS jsonb), who.tenant, who.user_id,
           'active', 1, {_BASE} - make_interval(secs => 60 + g), t.started,
           md5('lock' || g), {_BASE} + interval '1 day', {_run("t.started", None)}
    {_ROWS}
    {_WHO}
    CROSS JOIN LATERAL (SELECT {_BASE} - make_interval(secs => g) AS started) AS t
    """
)


def _opts(**given: Any) -> str:
    return json.dumps(JobOptions(**given).columns()[0])


def load_rows(statement: TextClause, kind: str, total: int, **params: Any) -> None:
    """Insert ``total`` rows of ``kind``, ``LOAD_CHUNK`` a statement, each its own transaction."""
    for first in range(1, total + 1, LOAD_CHUNK):
        last = min(total, first + LOAD_CHUNK - 1)
        with db.transaction() as session:
            session.execute(
                statement,
                {"kind": kind, "first": first, "last": last, "total": total, **params},
            )


def settle() -> None:
    """Fold the count trigger's deltas (as the promoter does), then VACUUM ANALYZE."""
    while counts.compact():
        pass
    with db.engine().connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("VACUUM (ANALYZE) jobs, job_count_deltas, job_counts")


def quiet(url: str, limit_s: float = 600.0, still_s: float = 5.0) -> dict[str, Any]:
    """Let the server finish what a load left it (before measuring on it): a ``CHECKPOINT``
    writes out the loaded pages now, then wait until no autovacuum worker has run for
    ``still_s`` (at most ``limit_s``). What it took, and whether it went quiet."""
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as connection:  # a Scratch URL: libpq's form
        checkpoint: str = "done"
        try:
            connection.execute("CHECKPOINT")
        except psycopg.Error as error:  # not a superuser (or pg_checkpoint) on this server
            checkpoint = f"not run: {error}".strip()
        checkpoint_s = time.perf_counter() - began
        still_since = time.perf_counter()
        while time.perf_counter() - began < limit_s:
            row = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            ).fetchone()
            if row and row[0]:
                still_since = time.perf_counter()
            elif time.perf_counter() - still_since >= still_s:
                break
            time.sleep(0.5)
        quiet_now = time.perf_counter() - still_since >= still_s
    return {
        "checkpoint": checkpoint,
        "checkpoint_s": round(checkpoint_s, 1),
        "waited_s": round(time.perf_counter() - began, 1),
        "quiet": quiet_now,
    }


def timed(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return round(time.perf_counter() - began, 2)


def load_delayed(total: int, opts: str) -> None:
    """Delayed jobs due over a day that starts ``DELAYED_LEAD_S`` from now."""
    base = datetime.now(UTC)
    load_rows(_DELAYED, "d", total, base=base, opts=opts, lead_s=DELAYED_LEAD_S)


def load_live(opts: str) -> None:
    """The live set both databases share: ``WAITING`` waiting jobs and ``ACTIVE`` running."""
    base = datetime.now(UTC)
    load_rows(_WAITING, "w", WAITING, base=base, opts=opts)
    load_rows(_ACTIVE, "a", ACTIVE, base=base, opts=opts)


def populate(url: str, records: int, delayed: int) -> dict[str, float]:
    """Load a database (the live set, after ``records`` and ``delayed`` if any); seconds each."""
    use_database(url)
    retained, later = _opts(attempts=3), _opts(attempts=3, delay=3_600_000)
    base = datetime.now(UTC)
    took = {
        "finished": timed(
            lambda: load_rows(_FINISHED, "f", records, base=base, opts=retained, states=STATE_MIX)
        ),
        "delayed": timed(lambda: load_delayed(delayed, later)),
        "live": timed(lambda: load_live(retained)),
        "counts_and_vacuum": timed(settle),
    }
    took["total"] = round(sum(took.values()), 2)
    return took


def table_size() -> dict[str, Any]:
    with db.transaction() as session:
        row = session.execute(
            text(
                "SELECT (SELECT count(*) FROM jobs) AS rows, "
                "pg_size_pretty(pg_table_size('jobs')) AS heap, "
                "pg_size_pretty(pg_indexes_size('jobs')) AS indexes"
            )
        ).one()
    return dict(row._mapping)


# --- targets ----------------------------------------------------------------------------------


def queue_name(i: int) -> str:
    return f"queue-{i:02d}"


@dataclass
class Targets:
    """What the runs on one database pick from: the same picks, in order, on both."""

    rng: random.Random
    waiting: list[str]
    active: list[tuple[str, str]]
    oldest_s: dict[State, float | None]

    @classmethod
    def load(cls, seed: int) -> Targets:
        with db.transaction() as session:
            waiting = session.execute(
                text("SELECT id FROM jobs WHERE state = 'waiting' ORDER BY id")
            ).scalars()
            active = session.execute(
                text("SELECT id, lock_token FROM jobs WHERE state = 'active' ORDER BY id")
            ).all()
            oldest = {state: _oldest_s(session, state) for state in OWN_RULE}
            return cls(random.Random(seed), list(waiting), [tuple(r) for r in active], oldest)

    def queue(self) -> str:
        return queue_name(self.rng.randrange(QUEUES))

    def owner(self) -> tuple[str, str]:
        return f"tenant-{self.rng.randrange(TENANTS):04d}", f"user-{self.rng.randrange(USERS)}"

    def waiting_id(self) -> str:
        return self.rng.choice(self.waiting)

    def active_job(self) -> Any:
        """What the end of a run needs of its ``ClaimedJob``: its id and lock token."""
        job_id, token = self.rng.choice(self.active)
        return SimpleNamespace(id=job_id, token=token)

    def new_job(self) -> store.NewJob:
        tenant, user = self.owner()
        queue = self.queue()
        return store.NewJob(
            id=str(uuid.UUID(int=self.rng.getrandbits(128))),
            name=f"job.{queue[-2:]}.0",
            queue=queue,
            data={"reportId": f"r-{self.rng.randrange(10**9)}", "rows": 100, "format": "csv"},
            tenant_id=tenant,
            user_id=user,
            opts=JobOptions(attempts=3),
            priority=0,
        )

    def sweep_age_s(self, state: State) -> int:
        """A steady sweep's age: the records one interval past the oldest have expired."""
        oldest = self.oldest_s[state]
        return int(oldest - SWEEP_INTERVAL_S) if oldest else 30 * 86_400


def _oldest_s(session: Session, state: State) -> float | None:
    """Age of the oldest record the default sweep of ``state`` may take (its partial index)."""
    age = session.execute(
        text(
            "SELECT extract(epoch FROM clock_timestamp() - min(finished_on)) FROM jobs "
            f"WHERE state = '{state.value}' AND NOT (opts ? '{OWN_RULE[state]}')"
        )
    ).scalar()
    return float(age) if age is not None else None


def partition_size(queue: str, tenant: str) -> int:
    with db.transaction() as session:
        return int(
            session.execute(
                text(
                    "SELECT count(*) FROM jobs "
                    "WHERE queue = :q AND tenant_id = :t AND state = 'completed'"
                ),
                {"q": queue, "t": tenant},
            ).scalar_one()
        )


# --- the statements ---------------------------------------------------------------------------

Call = Callable[[Session], object]


@dataclass(frozen=True)
class Probe:
    """A hot statement: ``prepare`` picks its targets and returns the call that sends it."""

    name: str
    source: str
    prepare: Callable[[Targets], Call]


def _claim(t: Targets) -> Call:
    token = uuid.UUID(int=t.rng.getrandbits(128)).hex
    return partial(runs.claim, job_id=t.waiting_id(), token=token, lock_s=LOCK_S, worker=WORKER)


def _complete(t: Targets) -> Call:
    params = runs._complete_params(t.active_job(), {"url": "s3://reports/r.csv"})
    return lambda session: session.execute(runs._COMPLETE_ALONE, params)


def _fail(t: Targets) -> Call:
    stack = ["Traceback (most recent call last): ..."]
    reason = "TimeoutError: the provider did not answer"
    return partial(runs.fail, job=t.active_job(), reason=reason, stack=stack, retry_in_ms=None)


def _defer(t: Targets) -> Call:
    return partial(
        runs.defer, job=t.active_job(), delay_ms=5_000, state=State.DELAYED, reason="rate limit"
    )


def _park(t: Targets) -> Call:
    return partial(upkeep.park, job_ids=[t.waiting_id()], in_s=5.0)


def _stalled(t: Targets) -> Call:
    return partial(upkeep.requeue_stalled, max_stalled=get_settings().max_stalled_count)


def _sweep(state: State) -> Callable[[Targets], Call]:
    def prepare(t: Targets) -> Call:
        age = t.sweep_age_s(state)
        return partial(upkeep.expire_finished, state=state, age_s=age, limit=retention.BATCH)

    return prepare


def _trim(t: Targets) -> Call:
    """A job type keeping its newest ``count`` completed records, at that count: one goes."""
    (tenant, _), queue = t.owner(), t.queue()
    keep = max(partition_size(queue, tenant) - 1, 0)
    partition = upkeep.Partition(queue, tenant, f"job.{queue[-2:]}.0")
    return partial(upkeep.trim, partition=partition, state=State.COMPLETED, count=keep, age_s=None)


def _listing(*, user: bool = False, state: str | None = None) -> Callable[[Targets], Call]:
    def prepare(t: Targets) -> Call:
        tenant, user_id = t.owner()
        where = JobFilter(tenant_id=tenant, user_id=user_id if user else None, state=state)
        return lambda _session: queries.list_jobs(where)

    return prepare


def _priorities(t: Targets) -> Call:
    job = t.new_job()
    return partial(tenancy.priorities, jobs=[(job.id, job.tenant_id, job.queue, 0)])


def _insert_counting(t: Targets) -> Call:
    return partial(store.insert_counting, job=t.new_job(), up_to=tenancy.LOAD_STEPS[-1])


def _admit(t: Targets) -> Call:
    """An API add against a tenant's quota (``admission.admit``, sent by ``run_alone``)."""
    job = t.new_job()
    params = {
        **store.row_of(job),
        "lock_key": tenancy.lock_key(str(job.tenant_id), "jobs"),
        "dedup_id": None,
        "dedup_ttl_ms": None,
        "max_live": 10_000,
        "up_to": tenancy.LOAD_STEPS[-1],
    }
    return lambda session: session.execute(admission._ADMIT, params)


ALL_QUEUES = [queue_name(i) for i in range(QUEUES)]
PROBES = [
    Probe("claim", "runs._CLAIM (claim_alone)", _claim),
    Probe("complete", "runs._COMPLETE_ALONE (complete_alone)", _complete),
    Probe("fail", "runs.fail (final)", _fail),
    Probe("defer", "runs.defer", _defer),
    Probe("promote due", "upkeep.promote_due", lambda t: upkeep.promote_due),
    Probe("park", "upkeep.park", _park),
    Probe("stalled check", "upkeep.requeue_stalled (stalls.py)", _stalled),
    Probe("sweep completed", "upkeep.expire_finished (retention.sweep)", _sweep(State.COMPLETED)),
    Probe("sweep failed", "upkeep.expire_finished (retention.sweep)", _sweep(State.FAILED)),
    Probe("trim by count", "upkeep.trim (ending.retention)", _trim),
    Probe("counts(queue)", "counts.counts", lambda t: lambda _s: counts.counts(t.queue())),
    Probe("tenant's jobs", "queries.list_jobs (GET /api/v1/jobs)", _listing()),
    Probe("user's jobs", "queries.list_jobs (GET /api/v1/jobs)", _listing(user=True)),
    Probe("tenant's failed", "queries.list_jobs (?state=failed)", _listing(state="failed")),
    Probe("tenant's active", "queries.list_jobs (?state=active)", _listing(state="active")),
    Probe(
        "queue age metric",
        "counts.oldest_waiting_s (/metrics)",
        lambda t: lambda _s: counts.oldest_waiting_s(ALL_QUEUES),
    ),
    Probe("tenancy priorities", "tenancy.priorities (promote)", _priorities),
    Probe("insert", "jobs.insert", lambda t: partial(store.insert, job=t.new_job())),
    Probe("insert counting", "jobs.insert_counting (.delay())", _insert_counting),
    Probe("admit", "admission._ADMIT (API add, quota)", _admit),
]


# --- measuring --------------------------------------------------------------------------------


class _Sent(Exception):
    """Raised instead of sending a statement: what would have been sent."""

    def __init__(self, sql: str, params: dict[str, Any]) -> None:
        super().__init__(sql)
        self.sql, self.params = sql, params


def _intercept(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
    raise _Sent(sql, dict(params or {}))


def capture(call: Call) -> tuple[str, dict[str, Any]]:
    """The first statement ``call`` sends (driver SQL and parameters); nothing reaches the
    server, and the call's transaction is rolled back."""
    engine = db.engine()
    event.listen(engine, "before_cursor_execute", _intercept)
    try:
        with db.transaction() as session:
            call(session)
    except _Sent as sent:
        return sent.sql, sent.params
    finally:
        event.remove(engine, "before_cursor_execute", _intercept)
    raise RuntimeError("the call sent no statement")


def explain(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of the statement, rolled back."""
    with db.engine().connect() as connection:
        driver = connection.connection.driver_connection
        driver.prepare_threshold = None  # type: ignore[union-attr]  # one-off statements
        found = connection.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params
        ).scalar_one()
        connection.rollback()
    return found[0]


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def jobs_scans(plan: dict[str, Any]) -> list[str]:
    """How the plan reads ``jobs``: its scan nodes on the table and its indexes."""
    found = []
    for node in nodes(plan):
        index = node.get("Index Name", "")
        on_jobs = node.get("Relation Name") == "jobs" or index.startswith(("ix_jobs", "pk_jobs"))
        if "Scan" in node["Node Type"] and on_jobs:
            found.append(f"{node['Node Type']} {index}".strip())
    return list(dict.fromkeys(found))


def rows(plan: dict[str, Any]) -> float:
    """Rows the statement returned, or (no RETURNING) those its modification was fed."""
    if plan["Node Type"] == "ModifyTable" and plan["Actual Rows"] == 0 and plan.get("Plans"):
        return plan["Plans"][0]["Actual Rows"]
    return plan["Actual Rows"]


def filtered_out(plan: dict[str, Any]) -> float:
    """Rows read and thrown away by a filter (a condition the index could not take)."""
    return sum(
        (n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0))
        * n["Actual Loops"]
        for n in nodes(plan)
    )


def top_node(plan: dict[str, Any]) -> str:
    operation = plan.get("Operation")
    return f"{plan['Node Type']} ({operation})" if operation else plan["Node Type"]


def summarize(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """Percentiles of the runs' plans, and the shape of the last one."""
    roots = [p["Plan"] for p in plans]

    def p50(values: list[float]) -> float:
        return round(percentile(values, 50), 3)

    times = [p["Execution Time"] for p in plans]
    return {
        "p50_ms": p50(times),
        "p99_ms": round(percentile(times, 99), 3),
        "planning_p50_ms": p50([p["Planning Time"] for p in plans]),
        "buffers_p50": p50([r["Shared Hit Blocks"] + r["Shared Read Blocks"] for r in roots]),
        "read_p50": p50([r["Shared Read Blocks"] for r in roots]),
        "rows_p50": p50([rows(r) for r in roots]),
        "filtered_out_p50": p50([filtered_out(r) for r in roots]),
        "top_node": top_node(roots[-1]),
        "jobs_scans": jobs_scans(roots[-1]),
        "seq_scan_on_jobs": any(
            n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
            for r in roots
            for n in nodes(r)
        ),
        "plan": plans[-1],
    }


def measure(probe: Probe, url: str, times: int) -> dict[str, Any]:
    """``times`` plans of the probe's statement on ``url``, after ``WARMUP`` more."""
    use_database(url)
    targets = Targets.load(zlib.crc32(probe.name.encode()))  # same picks on both databases
    plans = []
    for _ in range(WARMUP + times):
        sql, params = capture(probe.prepare(targets))
        plans.append(explain(sql, params))
    return {**summarize(plans[WARMUP:]), "sql": sql}


# --- reporting --------------------------------------------------------------------------------


def compare(probe: Probe, scratch: Scratch, times: int) -> dict[str, Any]:
    found = {which: measure(probe, scratch.url(which), times) for which in ("empty", "grown")}
    empty, grown = found["empty"]["p50_ms"], found["grown"]["p50_ms"]
    ratio = round(grown / empty, 2) if empty > 0 else None
    return {"source": probe.source, **found, "ratio_p50": ratio}


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _pair(result: dict[str, Any], key: str) -> str:
    """The value on both databases, or how it changed."""
    empty, grown = (_show(result[which][key]) for which in ("empty", "grown"))
    return empty if empty == grown else f"{empty} → {grown}"


def _seq(result: dict[str, Any]) -> str:
    on = [which for which in ("empty", "grown") if result[which]["seq_scan_on_jobs"]]
    return "**" + " + ".join(on) + "**" if on else "no"


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| statement | empty p50 / p99 ms | grown p50 / p99 ms | grown/empty p50 "
        "| buffers empty → grown | rows | rows filtered out | top node "
        "| jobs read by (grown) | seq scan |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name, r in results.items():
        empty, grown = r["empty"], r["grown"]
        lines.append(
            f"| {name} | {empty['p50_ms']:.3f} / {empty['p99_ms']:.3f} "
            f"| {grown['p50_ms']:.3f} / {grown['p99_ms']:.3f} | {r['ratio_p50'] or '-'}x "
            f"| {empty['buffers_p50']:g} → {grown['buffers_p50']:g} | {_pair(r, 'rows_p50')} "
            f"| {_pair(r, 'filtered_out_p50')} "
            f"| {_pair(r, 'top_node')} | {', '.join(grown['jobs_scans']) or '-'} | {_seq(r)} |"
        )
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.growth",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--database-url", required=True, help="a server to create scratch DBs on")
    parser.add_argument("--records", type=int, default=10_000_000, help="finished records")
    parser.add_argument("--delayed", type=int, default=100_000, help="delayed jobs")
    parser.add_argument("--runs", type=int, default=20, help="plans per statement and database")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    return parser.parse_args(argv)


def prepare(scratch: Scratch, records: int, delayed: int) -> dict[str, Any]:
    """Create, migrate and load both databases; what was loaded and how long it took."""
    scratch.create()
    loaded: dict[str, Any] = {}
    for which, (finished, later) in {"empty": (0, 0), "grown": (records, delayed)}.items():
        log(f"{scratch.names[which]}: migrating, loading {finished:,} + {later:,} + live set")
        migrate(scratch.url(which))
        loaded[which] = {"load_s": populate(scratch.url(which), finished, later), **table_size()}
        log(f"{scratch.names[which]}: {loaded[which]}")
    return loaded


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    scratch = Scratch.on(args.database_url)
    started = datetime.now(UTC)
    try:
        loaded = prepare(scratch, args.records, args.delayed)
        results = {}
        for probe in PROBES:
            log(f"measuring {probe.name}")
            results[probe.name] = compare(probe, scratch, args.runs)
    finally:
        if args.keep:
            log(f"kept {', '.join(scratch.names.values())}")
        else:
            scratch.drop()
    grown = loaded["grown"]
    table = (
        f"## Growth: {args.records:,} finished + {args.delayed:,} delayed records\n\n"
        f"Commit {measured_commit()}. grown `jobs`: {grown['rows']:,} rows, heap {grown['heap']},"
        f" indexes {grown['indexes']}; loaded in {grown['load_s']['total']} s. {args.runs} runs"
        f" per statement, server execution time.\n\n{markdown(results)}"
    )
    print(table)
    report = {
        "started": started.isoformat(),
        "server": scratch.server.render_as_string(hide_password=True),
        "records": args.records,
        "delayed": args.delayed,
        "runs": args.runs,
        "loaded": loaded,
        "statements": results,
    }
    log(f"wrote {write_report('growth', report, table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
