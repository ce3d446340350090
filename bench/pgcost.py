"""Postgres's cost per job, taken apart: what its insert, claim and completion cost the
server, and how much of that the counter triggers, the secondary indexes and flushing
each commit before it answers are.

Each variant is a database cloned from Keel's migrated one (``CREATE DATABASE ...
TEMPLATE``: a copy of everything in it, data included):

- ``as shipped``;
- ``no counter triggers``: the ``jobs_count_*`` triggers (``job_count_deltas``) disabled;
- ``no triggers, no secondary indexes``: those, and every index on ``jobs`` but its
  primary key dropped;
- ``synchronous_commit off``: as shipped, but a commit does not wait for its WAL flush
  (the WAL writer flushes it later). A reference only: Keel keeps it on (a crash could
  otherwise lose a claim or a completion and run a handler twice).

Two more rows run the shipped database's claims and completions ``--batch`` jobs at a time
(the same statements, ``id = ANY(...)`` for ``id = ...``, one lock token for the batch):
what batching them per worker process would save the server. Keel does not batch them.

One connection runs the statements of Keel's hot path, their SQL text taken from
``tasks.jobs.store`` (each its own transaction, as ``tasks.platform.db.run_alone`` runs them),
with the parameters Keel passes for a top-level job (no canvas context): the insert of
``jobs`` added one by one, their claims, then their completions. Around each kind the
server's CPU is read for that connection's backend and the WAL writer (``/proc``: the
server must run on this machine), and the WAL written (``pg_current_wal_insert_lsn``,
the whole server's: the variants' tables are not autovacuumed meanwhile). The variants
alternate within each run (A B C D ..., A B C D ...); the report gives medians per job. A
``SELECT 1`` per round gives the floor of any statement (the protocol's round, no commit).

    python -m bench.pgcost [--jobs 3000] [--runs 3] [--batch 4 16] [--results-dir DIR]

Uses the embedded Postgres unless ``KEEL_DATABASE_URL`` is set (a server on this
machine, whose account may create databases, and a database nobody else is connected to:
it is the variants' template). Writes
``bench/results/pgcost-<UTC timestamp>.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from psycopg import conninfo, sql

from bench.env import BenchEnv
from bench.report import RESULTS_DIR, log, measured_commit, write_report

SHIPPED = "as shipped"
NO_TRIGGERS = "no counter triggers"
BARE = "no triggers, no secondary indexes"
ASYNC = "synchronous_commit off"
VARIANTS = (SHIPPED, NO_TRIGGERS, BARE, ASYNC)
KINDS = ("insert", "claim", "completion")
COUNT_TRIGGERS = ("jobs_count_added", "jobs_count_removed", "jobs_count_states")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def statements() -> dict[str, str]:
    """The hot path's statements as the driver receives them (``tasks.platform.db.run_alone``)."""
    from sqlalchemy.dialects.postgresql import psycopg as dialect

    from tasks.jobs.store import jobs, runs

    def compiled(statement: Any) -> str:
        return str(statement.compile(dialect=dialect.dialect()))

    return {
        "insert": compiled(jobs._INSERT_COUNTING_BY_PARTY[True]),
        "claim": compiled(runs._CLAIM),
        "completion": compiled(runs._COMPLETE_ALONE),
    }


def batched(texts: dict[str, str]) -> dict[str, str]:
    """The claim and completion of several jobs a statement: ``id = ANY(%(ids)s)``."""
    out = dict(texts)
    for kind, one in (("claim", "id = %(id)s FOR UPDATE"), ("completion", "id = %(id)s AND")):
        if one not in texts[kind]:
            raise RuntimeError(f"the {kind}'s SQL no longer reads {one!r}: update bench.pgcost")
        out[kind] = texts[kind].replace(one, one.replace("= %(id)s", "= ANY(%(ids)s)"))
    return out


def batch_name(size: int) -> str:
    return f"claims and completions {size} a statement"


def parameters(ids: list[str], batch: int = 1) -> dict[str, Callable[[], Iterable[dict[str, Any]]]]:
    """Each kind's parameters for ``ids``, as Keel's add, claim and completion pass them;
    ``batch``: the claims' and completions' ids ``batch`` at a time (``batched``)."""
    from tasks.jobs.intake import tenancy
    from tasks.jobs.model.options import JobOptions
    from tasks.jobs.store.jobs import NewJob, row_of

    opts, token = JobOptions(), uuid.uuid4().hex
    done = json.dumps({"outcome": "completed"})

    def insert() -> Iterable[dict[str, Any]]:
        for job_id in ids:
            job = NewJob(
                id=job_id,
                name="bench.noop",
                queue="default",
                data={"i": 1},
                tenant_id=None,
                user_id=None,
                opts=opts,
                priority=0,
            )
            yield {**row_of(job), "up_to": tenancy.LOAD_STEPS[-1]}  # as Keel's add

    def keys() -> Iterable[dict[str, Any]]:
        if batch == 1:
            yield from ({"id": job_id} for job_id in ids)
        else:
            yield from ({"ids": ids[at : at + batch]} for at in range(0, len(ids), batch))

    def claim() -> Iterable[dict[str, Any]]:
        for key in keys():
            yield {
                **key,
                "token": token,
                "lock_s": 30.0,
                "worker": "pgcost@host",
                "pid": os.getpid(),
                "ctx": None,
            }

    def completion() -> Iterable[dict[str, Any]]:
        for key in keys():
            yield {**key, "token": token, "result": "null", "run_patch": done}

    return {"insert": insert, "claim": claim, "completion": completion}


def _cpu_s(pid: int) -> float:
    """The CPU time ``pid`` has run: the scheduler's nanoseconds where the kernel keeps them
    (``schedstat``), else ``stat``'s clock ticks (10 ms each)."""
    try:
        with open(f"/proc/{pid}/schedstat") as schedstat:
            return int(schedstat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime + stime


def _postgres_process(pid: int) -> None:
    """Refuse a pid that is not a Postgres process here (a server in a container reports
    pids of its own namespace)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            found = b"postgres" in cmdline.read()
    except OSError as exc:
        raise SystemExit(
            f"cannot read the server's process {pid} ({exc}): "
            "python -m bench.pgcost needs the Postgres server on this machine"
        ) from exc
    if not found:
        raise SystemExit(
            f"process {pid} here is not the server's: python -m bench.pgcost needs the "
            "Postgres server on this machine, in this process namespace"
        )


class Backend:
    """One autocommit connection to a database; the CPU of its server process and of the
    WAL writer (which flushes what a commit that does not wait leaves), and the WAL."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        writer = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        ).fetchone()
        self.pids = [int(pid), *([int(writer[0])] if writer and writer[0] else [])]
        for server_pid in self.pids:
            _postgres_process(server_pid)

    def cpu_s(self) -> float:
        return sum(_cpu_s(pid) for pid in self.pids)

    def wal(self) -> str:
        return str(self.conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])  # type: ignore[index]

    def wal_since(self, lsn: str) -> float:
        row = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (lsn,)
        ).fetchone()
        return float(row[0])  # type: ignore[index]

    def measured(self, statement: str, params: Iterable[dict[str, Any]], n: int) -> dict:
        """Run ``statement`` once per parameter set: server CPU (µs) and WAL (bytes) per job.
        The WAL is the cluster's: the variants' tables are not vacuumed meanwhile
        (``make_variants``), but another database's work would count."""
        cpu, lsn = self.cpu_s(), self.wal()
        for values in params:
            self.conn.execute(statement, values)  # type: ignore[arg-type]
        wal = self.wal_since(lsn)
        return {"cpu_us": 1e6 * (self.cpu_s() - cpu) / n, "wal_bytes": wal / n}

    def close(self) -> None:
        self.conn.close()


def _database_url(url: str, name: str) -> str:
    return conninfo.make_conninfo(url, dbname=name)


def make_variants(url: str, urls: dict[str, str]) -> None:
    """One database per variant into ``urls`` (each added once created, for the caller to
    drop whatever happens), cloned from ``url``'s, which nobody may be connected to. Their
    ``jobs`` and ``job_count_deltas`` are left to the rounds' own ``VACUUM`` (no
    autovacuum: its WAL would count)."""
    with psycopg.connect(url) as conn:
        source = str(conn.execute("SELECT current_database()").fetchone()[0])  # type: ignore[index]
    suffix = uuid.uuid4().hex[:8]
    with psycopg.connect(_database_url(url, "template1"), autocommit=True) as admin:
        for i, variant in enumerate(VARIANTS):
            name = f"keel_pgcost_{i}_{suffix}"
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(source)
                )
            )
            urls[variant] = _database_url(url, name)
    for variant, variant_url in urls.items():
        with psycopg.connect(variant_url, autocommit=True) as conn:
            for table in ("jobs", "job_count_deltas"):
                conn.execute(
                    sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off)").format(
                        sql.Identifier(table)
                    )
                )
            if variant in (NO_TRIGGERS, BARE):
                for trigger in COUNT_TRIGGERS:
                    conn.execute(
                        sql.SQL("ALTER TABLE jobs DISABLE TRIGGER {}").format(
                            sql.Identifier(trigger)
                        )
                    )
            if variant == BARE:
                pkey = conn.execute(
                    "SELECT conindid::regclass::text FROM pg_constraint"
                    " WHERE conrelid = 'jobs'::regclass AND contype = 'p'"
                ).fetchone()[0]  # type: ignore[index]
                for (index,) in conn.execute(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'"
                    " AND schemaname = current_schema() AND indexname <> %s",
                    (pkey,),
                ).fetchall():
                    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
            if variant == ASYNC:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
                        sql.Identifier(conninfo.conninfo_to_dict(variant_url)["dbname"])
                    )
                )


def drop_variants(url: str, urls: dict[str, str]) -> None:
    with psycopg.connect(_database_url(url, "template1"), autocommit=True) as admin:
        for variant_url in urls.values():
            name = conninfo.conninfo_to_dict(variant_url)["dbname"]
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def described(url: str) -> dict[str, Any]:
    """What a variant's database is: its indexes on ``jobs``, counter triggers enabled, and
    ``synchronous_commit``."""
    with psycopg.connect(url) as conn:
        indexes = conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = 'jobs'")
        triggers = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'jobs'::regclass"
            " AND tgname = ANY(%s) AND tgenabled <> 'D'",
            (list(COUNT_TRIGGERS),),
        )
        commit = conn.execute("SHOW synchronous_commit")
        return {
            "indexes": int(indexes.fetchone()[0]),  # type: ignore[index]
            "count_triggers": int(triggers.fetchone()[0]),  # type: ignore[index]
            "synchronous_commit": str(commit.fetchone()[0]),  # type: ignore[index]
        }


def one_round(variant_url: str, texts: dict[str, str], n: int, floor: bool, batch: int = 1) -> dict:
    """``n`` jobs through the three statements in one variant's database (the claims and
    completions ``batch`` at a time); emptied after."""
    backend = Backend(variant_url)
    try:
        ids = [f"pgcost-{uuid.uuid4().hex}" for _ in range(n)]
        params = parameters(ids, batch)
        out = {kind: backend.measured(texts[kind], params[kind](), n) for kind in KINDS}
        completed = backend.conn.execute(
            "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND state = 'completed'", (ids,)
        ).fetchone()[0]  # type: ignore[index]
        if completed != n:  # every statement did its work, or the figures mean nothing
            raise RuntimeError(f"{completed} of {n} jobs completed in {variant_url}")
        if floor:
            out["select 1"] = backend.measured("SELECT 1", ({} for _ in range(n)), n)
        backend.conn.execute("DELETE FROM jobs WHERE id = ANY(%s)", (ids,))
        backend.conn.execute("DELETE FROM job_count_deltas")
        backend.conn.execute("VACUUM jobs, job_count_deltas")
    finally:
        backend.close()
    return out


def summary(rounds: dict[str, list[dict]]) -> dict[str, Any]:
    """Medians per job of each variant and kind; the parts as differences of variants."""
    out: dict[str, Any] = {"variants": {}}
    for variant, samples in rounds.items():
        kinds = sorted({k for s in samples for k in s})
        medians = {
            kind: {
                "cpu_us": median(s[kind]["cpu_us"] for s in samples),
                "wal_bytes": median(s[kind]["wal_bytes"] for s in samples),
            }
            for kind in kinds
        }
        medians["claim and completion"] = {
            "cpu_us": median(s["claim"]["cpu_us"] + s["completion"]["cpu_us"] for s in samples),
            "wal_bytes": median(
                s["claim"]["wal_bytes"] + s["completion"]["wal_bytes"] for s in samples
            ),
        }
        medians["job"] = {
            "cpu_us": median(sum(s[k]["cpu_us"] for k in KINDS) for s in samples),
            "wal_bytes": median(sum(s[k]["wal_bytes"] for k in KINDS) for s in samples),
        }
        out["variants"][variant] = medians
    job = {variant: m["job"]["cpu_us"] for variant, m in out["variants"].items()}
    shipped = job[SHIPPED]
    parts = {
        "counter triggers": job[SHIPPED] - job[NO_TRIGGERS],
        "secondary indexes": job[NO_TRIGGERS] - job[BARE],
        "flushing each commit's WAL before it answers": job[SHIPPED] - job[ASYNC],
    }
    ran = {variant: m["claim and completion"]["cpu_us"] for variant, m in out["variants"].items()}
    for variant in job:
        if variant not in VARIANTS:  # a batched run (``batch_name``): what batching saves
            parts[f"saved by {variant}"] = ran[SHIPPED] - ran[variant]
    out["parts"] = {
        name: {"cpu_us": value, "share": value / shipped if shipped else None}
        for name, value in parts.items()
    }
    return out


def markdown(costs: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"## Postgres's cost per job, taken apart ({meta['jobs']:,} jobs a run, "
        f"median of {meta['runs']})",
        "",
        f"Commit {meta['commit']}, {meta['started']}, {meta['cpus']} CPUs, load average "
        f"{meta['loadavg']}. Server: {meta['server']}; "
        f"{meta['databases'][SHIPPED]['indexes']} indexes on `jobs` as shipped.",
        "",
        "| Variant | insert | claim | completion | per job | WAL per job |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for variant, m in costs["variants"].items():
        lines.append(
            f"| {variant} | "
            + " | ".join(f"{m[k]['cpu_us']:.0f} µs" for k in (*KINDS, "job"))
            + f" | {m['job']['wal_bytes']:,.0f} B |"
        )
    lines.append("")
    for name, part in costs["parts"].items():
        share = part["share"]
        lines.append(
            f"- {name}: {part['cpu_us']:.0f} µs a job"
            + (f" ({100 * share:.0f}% of the statements' server CPU per job)" if share else "")
        )
    floor = costs["variants"][SHIPPED].get("select 1")
    if floor:
        lines.append(f"- a statement's floor (`SELECT 1`, no commit): {floor['cpu_us']:.0f} µs")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pgcost",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per variant and run")
    parser.add_argument("--runs", type=int, default=3, help="runs over every variant")
    parser.add_argument(
        "--batch",
        type=int,
        nargs="*",
        default=[4, 16],
        help="also claims and completions this many a statement (as shipped otherwise)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    env = BenchEnv()
    started = datetime.now(UTC)
    urls: dict[str, str] = {}
    try:
        env.start()
        from tasks.platform import db

        db.dispose()  # nobody may be connected to the database the variants are cloned from
        url = os.environ["KEEL_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
        texts = statements()
        make_variants(url, urls)
        rounds: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
        for size in args.batch:
            rounds[batch_name(size)] = []
        for run in range(args.runs):
            for variant in VARIANTS:
                log(f"run {run + 1}/{args.runs}: {variant}, {args.jobs} jobs")
                rounds[variant].append(
                    one_round(urls[variant], texts, args.jobs, floor=variant == SHIPPED)
                )
            for size in args.batch:
                log(f"run {run + 1}/{args.runs}: {batch_name(size)}, {args.jobs} jobs")
                rounds[batch_name(size)].append(
                    one_round(urls[SHIPPED], batched(texts), args.jobs, False, size)
                )
        databases = {variant: described(variant_url) for variant, variant_url in urls.items()}
        meta = {
            "commit": measured_commit(),
            "started": started.isoformat(timespec="seconds"),
            "jobs": args.jobs,
            "runs": args.runs,
            "cpus": os.cpu_count(),
            "loadavg": "/".join(f"{x:.1f}" for x in os.getloadavg()),
            "server": env.describe()["postgres"],
            "databases": databases,
        }
    finally:
        try:
            if urls:
                drop_variants(url, urls)
        finally:
            env.stop()
    costs = summary(rounds)
    table = markdown(costs, meta)
    print(table)
    report = {"meta": meta, "per_job": costs, "rounds": rounds}
    log(f"wrote {write_report('pgcost', report, table, args.results_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
