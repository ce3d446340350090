"""P1 (no-op jobs) and P2 (fail once, then succeed): bare Celery against Keel, end to end.

A repetition enqueues N jobs from this process, one by one, into an idle,
warmed-up worker (``-c 2``, prefork) and ends when the last one finished.
The end is read from the systems' own timestamps — Celery's ``date_done``,
Keel's ``finished_on`` — so the polling interval does not blur the figure.
Each repetition gets a fresh worker; the other system's worker is not running.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from statistics import median
from typing import Any

import redis
from sqlalchemy import text

from bench import bare, jobs
from bench.meters import CpuMeter, RoundTrips
from bench.peers.systems import PEERS, System, peers
from bench.plan import Batch, Run, batch_timeout
from bench.procs import CeleryWorker, Child
from bench.stats import Figure, Series, ratio

POLL_S = 0.1
# P1's floors (issue: durability from the record should cost less than Celery's own).
DRAIN_TARGET = 1.0
RATE_TARGET = 1.0  # Keel's jobs/s over bare Celery's, and over procrastinate's
CPU_TARGET = 1.0  # Keel's CPU per job over bare Celery's, at most
#: Lets a paused worker at what was enqueued; returns when (epoch seconds) it did.
Release = Callable[[], float]
DrainBatch = Callable[[int, Release | None], Batch]


def _parse_done(value: str) -> float:
    done = datetime.fromisoformat(value)
    return (done if done.tzinfo else done.replace(tzinfo=UTC)).timestamp()


def bare_batch(run: Run, task: Callable, n: int, release: Release | None = None) -> Batch:
    """Enqueue ``n`` bare tasks; wait for every result; jobs/s from first send to last done
    (or, with ``release``, from when it let the worker at the enqueued tasks)."""
    client = redis.Redis.from_url(run.env.child_env()["KEEL_REDIS_URL"])
    started = time.time()
    ids = [task.apply_async(queue=bare.QUEUE).id for _ in range(n)]
    enqueued = time.time() - started
    if release is not None:
        started = release()
    pending, done, failed = set(ids), [], 0
    deadline = time.monotonic() + batch_timeout(n)
    while pending and time.monotonic() < deadline:
        batch = list(pending)
        for start in range(0, len(batch), 1000):
            chunk = batch[start : start + 1000]
            for task_id, raw in zip(
                chunk, client.mget([f"celery-task-meta-{i}" for i in chunk]), strict=True
            ):
                meta = json.loads(raw) if raw else {}
                if meta.get("status") in ("SUCCESS", "FAILURE"):
                    pending.discard(task_id)
                    done.append(_parse_done(meta["date_done"]))
                    failed += meta["status"] == "FAILURE"
        if pending:
            time.sleep(POLL_S)
    if pending:
        raise TimeoutError(f"bare Celery: {len(pending)} of {n} tasks unfinished")
    result = {"rate": n / (max(done) - started), "enqueue_rate": n / enqueued, "failed": failed}
    return result, lambda: client.delete(*[f"celery-task-meta-{i}" for i in ids])


_KEEL_PROGRESS = text(
    "SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'failed'),"
    " max(finished_on), coalesce(sum(attempts_made), 0) FROM jobs WHERE id = ANY(:ids)"
)


def keel_batch(
    run: Run, name: str, n: int, opts: object | None, release: Release | None = None
) -> Batch:
    """Add ``n`` Keel jobs with ``tasks.jobs.intake``; finished when the records say so
    (timed from the first add, or from ``release`` as in ``bare_batch``)."""
    from tasks.jobs import add
    from tasks.jobs.store import counts
    from tasks.platform.db import transaction

    started = time.time()
    ids = [add(name, {"i": i}, queue=jobs.QUEUE, opts=opts).job_id for i in range(n)]
    enqueued = time.time() - started
    if release is not None:
        started = release()
    deadline = time.monotonic() + batch_timeout(n)
    polls = 0  # each its own transaction (bench.capacity takes them out of the commits)
    while True:
        with transaction() as session:
            completed, failed, last, attempts = session.execute(_KEEL_PROGRESS, {"ids": ids}).one()
        polls += 1
        if completed + failed == n:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"Keel: {n - completed - failed} of {n} jobs unfinished")
        time.sleep(POLL_S)

    def cleanup() -> None:  # keep every repetition on the same table size
        with transaction() as session:
            session.execute(text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": ids})
        counts.compact(max_rows=10 * n)

    return {
        "rate": n / (last.timestamp() - started),
        "enqueue_rate": n / enqueued,
        "failed": failed,
        "failed_runs": int(attempts),
        "polls": polls,
    }, cleanup


def measured(run: Run, worker: Child, n: int, batch: Callable[[int], Batch]) -> dict:
    """Warm the fresh worker up, then one measured batch with the CPU it cost per job."""
    with worker:
        batch(run.sizes.warmup_jobs)[1]()
        meter = CpuMeter({"worker": worker.pid, **run.env.server_pids()})
        before = meter.read()
        result, cleanup = batch(n)
        spent = CpuMeter.spent(before, meter.read())
        cleanup()
    result["cpu_ms_per_job"] = {group: 1000 * s / n for group, s in spent.items()}
    result["cpu_ms_per_job_total"] = sum(result["cpu_ms_per_job"].values())
    return result


def _drained(run: Run, worker: Child, queue: str, n: int, batch: DrainBatch) -> dict:
    """Drain: ``n`` jobs enqueued while the warmed-up worker does not consume ``queue``
    (Celery's ``cancel_consumer``), then timed from ``add_consumer`` to the last one done,
    with the CPU the drain cost (worker and servers; the producer has finished)."""
    from tasks.celery import app

    with worker:
        batch(run.sizes.warmup_jobs, None)[1]()
        meter = CpuMeter({"worker": worker.pid, **run.env.server_pids()})
        marks: dict[str, Any] = {}

        def release() -> float:
            marks["cpu"], began = meter.read(), time.time()
            app.control.add_consumer(queue, reply=True, timeout=5)
            return began

        app.control.cancel_consumer(queue, reply=True, timeout=5)
        result, cleanup = batch(n, release)
        spent = CpuMeter.spent(marks["cpu"], meter.read())
        cleanup()
    result["cpu_ms_per_job_total"] = sum(1000 * s / n for s in spent.values())
    return result


def drain(run: Run, fig: Figure, n: int) -> None:
    """P1's drain (worker only), bare Celery and Keel alternating; the figure's ``drain`` detail."""
    conc = run.sizes.worker_concurrency
    systems: dict[str, tuple[Callable[[], Child], str, DrainBatch]] = {
        "bare Celery": (
            lambda: CeleryWorker(run.env, "bare-drain", "bench.bare", conc, ["-Q", bare.QUEUE]),
            bare.QUEUE,
            lambda k, release: bare_batch(run, bare.noop, k, release),
        ),
        "Keel": (
            lambda: CeleryWorker(run.env, "keel-drain", "tasks", conc, ["-I", "bench.jobs"]),
            jobs.QUEUE,
            lambda k, release: keel_batch(run, jobs.NOOP, k, None, release),
        ),
    }
    rates = {name: Series(f"{name} drain", "jobs/s") for name in systems}
    cpu = {name: Series(f"{name} drain CPU per job", "ms", chart=False) for name in systems}
    for rep in range(run.repeat):
        for name, (worker, queue, batch) in systems.items():
            run.log(f"{fig.key} drain rep {rep + 1}/{run.repeat}: {name}, {n} jobs")
            result = _drained(run, worker(), queue, n, batch)
            rates[name].samples.append(result["rate"])
            cpu[name].samples.append(result["cpu_ms_per_job_total"])
            run.log(f"  {name} drain: {result['rate']:.0f} jobs/s")
    fig.series.extend([*rates.values(), *cpu.values()])
    drained = ratio(rates["Keel"], rates["bare Celery"])
    fig.details["drain_ratio"] = drained
    fig.details["drain_cpu_ratio"] = ratio(cpu["Keel"], cpu["bare Celery"])
    fig.notes.append(
        f"drain (worker only: {n} jobs enqueued while the worker did not consume its queue, "
        "timed from Celery's add_consumer to the last one done): "
        + ", ".join(f"{name} {rates[name].median:.0f}/s" for name in systems)
        + f"; Keel/bare = {drained:.2f}x (target >= {DRAIN_TARGET}x), CPU per job Keel/bare = "
        f"{fig.details['drain_cpu_ratio']:.1f}x"
    )


def traced(run: Run, fig: Figure, n: int) -> None:
    """P1's Keel batch with the worker tracing (OTLP to a sink here, the default sampler:
    every run sampled) against the same without, alternating; ``traced_ratio`` in the
    figure's details. The producer (this process) does not trace: each run is a trace of
    its own, with Celery's run span, Keel's claim, handler and finish spans, and a span
    per statement and Redis call."""
    from bench.otlp_sink import Sink

    sink = Sink()
    conc = run.sizes.worker_concurrency
    otel = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        "OTEL_SERVICE_NAME": "keel-bench",
    }
    systems = {
        "Keel": CeleryWorker(run.env, "keel-untraced", "tasks", conc, ["-I", "bench.jobs"]),
        "Keel traced": CeleryWorker(
            run.env, "keel-traced", "tasks", conc, ["-I", "bench.jobs"], extra_env=otel
        ),
    }
    rates = {name: Series(f"{name} (tracing)", "jobs/s", chart=False) for name in systems}
    cpu = {name: Series(f"{name} CPU per job (tracing)", "ms", chart=False) for name in systems}
    try:
        for rep in range(run.repeat):
            for name, worker in systems.items():
                run.log(f"{fig.key} tracing rep {rep + 1}/{run.repeat}: {name}, {n} jobs")
                result = measured(run, worker, n, lambda k: keel_batch(run, jobs.NOOP, k, None))
                rates[name].samples.append(result["rate"])
                cpu[name].samples.append(result["cpu_ms_per_job_total"])
                run.log(f"  {name}: {result['rate']:.0f} jobs/s")
    finally:
        sink.close()
    fig.series.extend([*rates.values(), *cpu.values()])
    fig.details["traced_ratio"] = ratio(rates["Keel traced"], rates["Keel"])
    fig.details["traced_cpu_ratio"] = ratio(cpu["Keel traced"], cpu["Keel"])
    fig.details["traced_exports"] = {"requests": sink.requests, "bytes": sink.bytes}
    fig.notes.append(
        "tracing (worker exporting every run's spans over OTLP to a local sink, sampler "
        f"always on; {sink.requests} exports, {sink.bytes / 1e6:.1f} MB): "
        + ", ".join(f"{name} {rates[name].median:.0f}/s" for name in systems)
        + f"; traced/untraced = {fig.details['traced_ratio']:.2f}x jobs/s, "
        f"{fig.details['traced_cpu_ratio']:.2f}x CPU per job"
    )


def durability(run: Run) -> dict[str, str]:
    """What each system's work survives, read from the servers and apps it ran with."""
    from tasks.celery import app as keel_app
    from tasks.platform.db import transaction

    with transaction() as session:
        pg = {
            name: session.execute(text(f"SHOW {name}")).scalar_one()
            for name in ("fsync", "synchronous_commit", "full_page_writes")
        }
    client = redis.Redis.from_url(run.env.child_env()["KEEL_REDIS_URL"])
    try:  # INFO, not CONFIG (which the embedded Redis does not offer)
        aof = client.info("persistence").get("aof_enabled")
        redis_text = f"append-only file {'on' if aof else 'off'}"
    except redis.RedisError:
        redis_text = "not readable here"
    finally:
        client.close()
    postgres = ", ".join(f"{k} {v}" for k, v in pg.items())
    bare_conf, keel_conf = bare.app.conf, keel_app.conf
    return {
        "postgres": postgres,
        "redis": redis_text,
        "bare Celery": (
            f"acks_late {bare_conf.task_acks_late}, prefetch multiplier "
            f"{bare_conf.worker_prefetch_multiplier}, kombu's unacked copy of each message, "
            "results in Redis"
        ),
        "Keel": (
            f"every job recorded in Postgres before its message is sent; acks_late "
            f"{keel_conf.task_acks_late}, prefetch multiplier "
            f"{keel_conf.worker_prefetch_multiplier}; a recorded job's message has no "
            "unacked copy (the record brings it back); results in the record"
        ),
        "procrastinate": "jobs and their events in Postgres, one transaction per transition",
        "pgqueuer": "jobs in Postgres, a log row per transition",
    }


def _pair(
    run: Run,
    fig: Figure,
    n: int,
    bare_task: Callable,
    keel_name: str,
    keel_opts: object | None,
    flaky: bool,
) -> None:
    """Bare Celery, Keel, then each installed peer, in turn within every repetition."""
    conc = run.sizes.worker_concurrency
    systems: dict[str, System] = {
        "bare Celery": (
            lambda: CeleryWorker(run.env, "bare-bench", "bench.bare", conc, ["-Q", bare.QUEUE]),
            lambda k: bare_batch(run, bare_task, k),
        ),
        "Keel": (
            lambda: CeleryWorker(run.env, "keel-bench", "tasks", conc, ["-I", "bench.jobs"]),
            lambda k: keel_batch(run, keel_name, k, keel_opts),
        ),
    }
    found, left_out = peers(run, flaky)
    systems.update(found)
    rates = {name: Series(name, "jobs/s") for name in systems}
    cpu = {name: Series(f"{name} CPU per job", "ms", chart=False) for name in systems}
    checks: list[dict] = []
    for rep in range(run.repeat):
        for name, (worker, batch) in systems.items():  # A, B, C, D, A, B, C, D, ...
            run.log(f"{fig.key} rep {rep + 1}/{run.repeat}: {name}, {n} jobs")
            result = measured(run, worker(), n, batch)
            rates[name].samples.append(result["rate"])
            cpu[name].samples.append(result["cpu_ms_per_job_total"])
            checks.append({"system": name, "rep": rep, **result})
            run.log(
                f"  {name}: {result['rate']:.0f} jobs/s, "
                f"{result['cpu_ms_per_job_total']:.1f} CPU ms/job"
            )
    bare_s, keel_s = rates["bare Celery"], rates["Keel"]
    fig.series = [*rates.values(), *cpu.values()]
    fig.ratio = ratio(keel_s, bare_s)
    fig.ratio_text = "Keel / bare Celery (jobs/s)"
    fig.details = {
        "durability": durability(run),
        "jobs_per_repetition": n,
        "runs": checks,
        "worker_concurrency": conc,
        "cpu_ratio": ratio(cpu["Keel"], cpu["bare Celery"]),
        "peers": list(found),
    }
    for peer in PEERS:  # Keel's jobs/s over the peer's; None where it was not measured
        fig.details[f"vs_{peer}"] = ratio(keel_s, rates[peer]) if peer in found else None
    enqueue = {
        name: median(c["enqueue_rate"] for c in checks if c["system"] == name) for name in systems
    }
    fig.notes.append(
        "enqueue alone (producer, one thread): "
        + ", ".join(f"{name} {rate:.0f}/s" for name, rate in enqueue.items())
        + "; CPU per job (all processes: producer, worker tree, Postgres, Redis) "
        + ", ".join(f"{name} {cpu[name].median:.1f} ms" for name in systems)
        + f"; Keel/bare = {ratio(cpu['Keel'], cpu['bare Celery']):.1f}x"
    )
    fig.notes.append(
        "durability: "
        + "; ".join(f"{name}: {what}" for name, what in fig.details["durability"].items())
    )
    if found:
        fig.notes.append(
            "Keel against the other Postgres job queues (jobs/s, each its own worker CLI "
            f"with {conc} jobs at a time, the end read from its own records): "
            + ", ".join(
                f"Keel/{peer} = {fig.details[f'vs_{peer}']:.2f}x "
                f"(CPU per job Keel/{peer} = {ratio(cpu['Keel'], cpu[peer]):.1f}x)"
                for peer in found
            )
        )
    fig.notes.extend(left_out)
    if any(c["failed"] for c in checks):
        fig.error = "some jobs failed"


def _set_statement_log(level: str) -> None:
    """The server's ``log_statement`` (``all`` while round trips are counted, else ``none``)."""
    from tasks.platform.db import engine

    with engine().connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text(f"ALTER SYSTEM SET log_statement = '{level}'"))
        connection.execute(text("SELECT pg_reload_conf()"))
    time.sleep(0.3)  # every backend reads the new setting before its next statement


def _round_trips(run: Run, n: int) -> dict[str, float | None]:
    """Per no-op job, untimed (the statement log costs): Keel's Postgres statements and Redis
    requests, and bare Celery's Redis requests, each against a fresh warmed-up worker."""
    import psycopg

    from tasks.jobs import add
    from tasks.platform.db import engine

    conc = run.sizes.worker_concurrency
    client = redis.Redis.from_url(run.env.child_env()["KEEL_REDIS_URL"])
    found: dict[str, float | None] = {}
    with CeleryWorker(run.env, "keel-trips", "tasks", conc, ["-I", "bench.jobs"]):
        keel_batch(run, jobs.NOOP, run.sizes.warmup_jobs, None)[1]()
        url = engine().url.set(drivername="postgresql").render_as_string(hide_password=False)
        poller = psycopg.connect(url, autocommit=True)
        meter = RoundTrips(
            client,
            run.env.postgres_log(),
            _set_statement_log,
            exclude_pids={poller.info.backend_pid},
        )
        with meter:
            ids = [add(jobs.NOOP, {"i": i}, queue=jobs.QUEUE).job_id for i in range(n)]
            wait = "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND state = 'completed'"
            deadline = time.monotonic() + batch_timeout(n)
            while poller.execute(wait, (ids,)).fetchone()[0] < n:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise TimeoutError("Keel: round-trip batch unfinished")
                time.sleep(0.2)
        poller.close()
        found["keel_postgres"] = meter.postgres / n if meter.postgres is not None else None
        found["keel_redis"] = (meter.redis or 0) / n
    with CeleryWorker(run.env, "bare-trips", "bench.bare", conc, ["-Q", bare.QUEUE]):
        bare_batch(run, bare.noop, run.sizes.warmup_jobs)[1]()
        meter = RoundTrips(client)
        with meter:  # the batch polls Redis too: its MGETs are taken out below
            _, cleanup = bare_batch(run, bare.noop, n)
        cleanup()
        found["bare_redis"] = (meter.redis or 0) / n
    return found


def p1_noop(run: Run) -> Figure:
    fig = Figure(
        "P1",
        "No-op jobs, enqueue → all finished",
        target=f"Keel ≥ {RATE_TARGET}x bare Celery (durable: late acks, prefetch 1, results) "
        f"and ≥ {RATE_TARGET}x procrastinate, CPU per job ≤ {CPU_TARGET}x bare, "
        f"drain ≥ {DRAIN_TARGET}x bare",
    )
    _pair(run, fig, run.sizes.noop_jobs, bare.noop, jobs.NOOP, None, flaky=False)
    drain(run, fig, run.sizes.noop_jobs)
    traced(run, fig, run.sizes.noop_jobs)
    vs_procrastinate = fig.details["vs_procrastinate"]
    fig.met = (
        fig.ratio is not None
        and fig.ratio >= RATE_TARGET
        and fig.details["cpu_ratio"] <= CPU_TARGET
        and fig.details["drain_ratio"] >= DRAIN_TARGET
        and (vs_procrastinate is None or vs_procrastinate >= RATE_TARGET)
    )
    if vs_procrastinate is None:
        fig.notes.append("the target's procrastinate part was not checked (not measured)")
    n = min(run.sizes.noop_jobs, 1000)
    run.log(f"P1 round trips: {n} jobs each, statement log on (untimed)")
    trips = _round_trips(run, n)
    fig.details["round_trips_per_job"] = trips
    postgres = trips["keel_postgres"]
    fig.notes.append(
        "round trips per no-op job (server-side counts, untimed pass of "
        f"{n} jobs): Keel {'n/a' if postgres is None else f'{postgres:.1f}'} Postgres "
        f"statements, {trips['keel_redis']:.1f} Redis requests; bare Celery "
        f"{trips['bare_redis']:.1f} Redis requests (with its result polling)"
    )
    return fig


def p2_retry(run: Run) -> Figure:
    from tasks.jobs import JobOptions

    fig = Figure("P2", "Fail once, then succeed", target="Keel ≥ 0.5x bare Celery")
    _pair(
        run, fig, run.sizes.retry_jobs, bare.flaky, jobs.FLAKY, JobOptions(attempts=2), flaky=True
    )
    fig.met = fig.ratio is not None and fig.ratio >= 0.5
    n = run.sizes.retry_jobs
    recorded = ("Keel", *fig.details["peers"])  # bare Celery keeps no record of a failed run
    wrong = sorted(
        {
            c["system"]
            for c in fig.details["runs"]
            if c["system"] in recorded and c["failed_runs"] != n
        }
    )
    if wrong:
        fig.error = f"{', '.join(wrong)} did not record exactly one failed run per job"
    if "procrastinate" in fig.details["peers"]:
        waits = [
            c["retry_wait_max_s"] for c in fig.details["runs"] if c["system"] == "procrastinate"
        ]
        fig.notes.append(
            "procrastinate: a retry wakes no worker (only an insert notifies one), so a job "
            "retried after the last insert waits for the worker's next poll (every 5 s by "
            f"default); the longest wait of a retried job here: {max(waits):.1f} s"
        )
    return fig
