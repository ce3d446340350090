"""Queue health from the records, and recovery when the broker loses its data."""

from __future__ import annotations

import random
import threading

import pytest
from sqlalchemy import text

from tasks.jobs import Backoff, BulkJob, JobOptions, add, add_bulk
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe.queue_counts import counts
from tasks.platform.db import engine
from tests.support.client import bearer, metrics_headers, unique, wait_state
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.usefixtures("worker")
FIVE = ("waiting", "active", "delayed", "completed", "failed")


def both_views(queue: str) -> tuple[dict[str, int], dict[str, int]]:
    """The counters and a full count, read in one snapshot."""
    with engine().connect() as conn:
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        exact = dict.fromkeys(FIVE, 0)
        exact.update(
            dict(
                conn.execute(
                    text("SELECT state, count(*) FROM jobs WHERE queue = :q GROUP BY state"),
                    {"q": queue},
                ).all()
            )
        )
        fast = dict.fromkeys(FIVE, 0)
        fast.update(
            {
                s: int(n)
                for s, n in conn.execute(
                    text(
                        "SELECT state, sum(n) FROM (SELECT state, n FROM job_counts "
                        "WHERE queue = :q UNION ALL SELECT state, n FROM job_count_deltas "
                        "WHERE queue = :q) c GROUP BY state"
                    ),
                    {"q": queue},
                ).all()
            }
        )
        conn.rollback()
    return {k: exact[k] for k in FIVE}, {k: fast[k] for k in FIVE}


def test_health_counts_equal_the_records_throughout_a_mixed_run(stack):
    # Given a queue of 100 mixed jobs: quick, failing with retries, and delayed
    queue = unique("mixed")
    rng = random.Random(5)
    kinds = [
        ("test.echo", JobOptions()),
        ("test.always_fails", JobOptions(attempts=2, backoff=Backoff(delay=200))),
        ("test.echo", JobOptions(delay=800)),
    ]
    worker = WorkerProcess(stack.home, unique("mixed"), concurrency=3, queues=queue)
    worker.start()
    mismatches: list = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            exact, fast = both_views(queue)
            if exact != fast:
                mismatches.append((exact, fast))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # When they all run
        for _ in range(100):
            name, opts = rng.choice(kinds)
            add(name, {}, queue=queue, opts=opts)
        wait_for(lambda: (c := counts(queue))["completed"] + c["failed"] == 100, timeout=90)
    finally:
        stop.set()
        sampler.join()
        worker.stop()
    # Then the counters never disagreed with a full count
    assert mismatches == []
    exact, fast = both_views(queue)
    assert exact == fast and sum(fast.values()) == 100


def test_counts_follow_bulk_adds_and_deletes_per_tenant(stack):
    """A bulk add and a delete of many rows are counted once per statement
    (``jobs_count_added``/``removed``): every queue, tenant and state of the batch, a job
    whose id was already recorded not again."""
    queue = unique("bulkcount")
    tenants = [unique("tenant"), unique("tenant")]
    ids = [unique("job") for _ in range(30)]
    for tenant, mine in zip(tenants, (ids[:20], ids[20:]), strict=True):
        batch = [
            BulkJob("test.echo", {}, queue, JobOptions(jobId=i, delay=60_000 if n % 3 else 0))
            for n, i in enumerate(mine)
        ]
        add_bulk(batch, owner=Owner(tenant, "u"))
    again = add_bulk(
        [BulkJob("test.echo", {}, queue, JobOptions(jobId=i)) for i in ids[:5]]
        + [BulkJob("test.echo", {}, queue, JobOptions(jobId=unique("job")))],
        owner=Owner(tenants[0], "u"),
    )
    assert [a.created for a in again] == [False] * 5 + [True]
    exact, fast = both_views(queue)
    assert exact == fast and exact["delayed"] == 19 and exact["waiting"] == 12
    # Per tenant: the first holds 20 + 1 jobs (7 + 1 waiting), the second 10 (4 waiting)
    assert counts(queue, tenants[0])["waiting"] == 8 and counts(queue, tenants[0])["delayed"] == 13
    assert counts(queue, tenants[1])["waiting"] == 4 and counts(queue, tenants[1])["delayed"] == 6
    with engine().begin() as conn:  # one statement over both tenants and both states
        gone = conn.execute(
            text("DELETE FROM jobs WHERE queue = :q AND id = ANY(:ids)"),
            {"q": queue, "ids": ids[:3] + ids[20:24]},
        ).rowcount
    assert gone == 7
    exact, fast = both_views(queue)
    assert exact == fast and sum(exact.values()) == 24
    assert sum(counts(queue, tenants[1]).values()) == 6
    # One delta row per queue, tenant and state a statement touched (seen before its commit,
    # which no compaction can fold yet)
    with engine().begin() as conn:
        before = deltas(conn, queue)
        conn.execute(
            text(
                "INSERT INTO jobs (id, queue, name, data, opts, state, tenant_id) "
                "SELECT :p || n, :q, 'test.echo', '{}', '{}', "
                "CASE WHEN n % 2 = 0 THEN 'waiting' ELSE 'delayed' END, :t "
                "FROM generate_series(1, 10) AS n"
            ),
            {"p": unique("raw"), "q": queue, "t": tenants[0]},
        )
        assert deltas(conn, queue) == before + 2
        conn.execute(text("DELETE FROM jobs WHERE queue = :q"), {"q": queue})
        assert deltas(conn, queue) == before + 2 + 4  # 2 tenants x 2 states
        conn.rollback()


def deltas(conn, queue: str) -> int:
    query = text("SELECT count(*) FROM job_count_deltas WHERE queue = :q")
    return int(conn.execute(query, {"q": queue}).scalar_one())


def test_health_endpoint_is_for_operators(client):
    assert client.get("/api/v1/reports/queue/health", headers=bearer()).status_code == 403
    response = client.get("/api/v1/reports/queue/health", headers=bearer(roles=("operator",)))
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == set(FIVE) and all(isinstance(v, int) and v >= 0 for v in body.values())


def test_waiting_jobs_survive_a_redis_restart_without_persistence(stack):
    # Given 100 jobs waiting on a queue nobody consumes yet
    queue = unique("reset")
    jobs = [add("test.echo", {"i": i}, queue=queue).job_id for i in range(100)]
    # When Redis restarts empty
    stack.restart_redis()
    # Then, once a worker consumes the queue, every job completes exactly once
    worker = WorkerProcess(stack.home, unique("reset"), concurrency=3, queues=queue)
    worker.start()
    try:
        done = [wait_state(j, "completed", timeout=60) for j in jobs]
    finally:
        worker.stop()
    assert all(job["attemptsStarted"] == 1 and len(job["runs"]) == 1 for job in done)


def test_metrics_count_events_and_time_runs_from_every_process(client):
    # Given a report that fails once, then completes (run by the worker process)
    response = client.post(
        "/api/v1/reports",
        headers=bearer(),
        json={"reportId": unique(), "rows": 3, "failUntilAttempt": 1},
    )
    wait_state(response.get_json()["jobId"], "completed", timeout=30)
    name = 'job_name="report.generate"'
    retried = f'keel_job_events_total{{event="retrying",{name},queue="reports"}}'
    completed = f'keel_job_events_total{{event="completed",{name},queue="reports"}}'
    runs = f'keel_job_duration_seconds_count{{{name},queue="reports"}}'

    def exposed() -> tuple[str, dict[str, float]] | None:
        """/metrics, once it counts both runs (a worker process sends its counts every
        second: tasks.jobs.observe.metrics.FLUSH_S)."""
        text_body = client.get("/metrics", headers=metrics_headers()).get_data(as_text=True)
        samples = {}
        for line in text_body.splitlines():
            if line and not line.startswith("#"):
                metric, _, value = line.rpartition(" ")
                samples[metric] = float(value)
        counted = samples.get(retried, 0) >= 1 and samples.get(completed, 0) >= 1
        return (text_body, samples) if counted and samples.get(runs, 0) >= 2 else None

    # Then the web app's /metrics shows what the worker recorded
    text_body, samples = wait_for(exposed, 10)
    assert samples[f'keel_job_events_total{{event="retrying",{name},queue="reports"}}'] >= 1
    assert samples[f'keel_job_events_total{{event="completed",{name},queue="reports"}}'] >= 1
    # and both runs' times, by job name
    assert samples[f'keel_job_duration_seconds_count{{{name},queue="reports"}}'] >= 2
    assert samples[f'keel_job_wait_seconds_bucket{{{name},le="+Inf",queue="reports"}}'] >= 2
    assert samples[f'keel_job_duration_seconds_sum{{{name},queue="reports"}}'] > 0
    assert 'keel_jobs{queue="reports",state="completed"}' in text_body
    # And what the worker's heartbeat and Postgres say beside the counters
    assert samples["keel_workers_alive"] >= 1
    assert samples['keel_jobs_delayed_due{queue="reports"}'] >= 0
    # (the counter is the web process's: earlier tests may have counted errors in it)
    assert (
        text_body.count("keel_jobs{") >= 7
        and 'keel_scrape_errors_total{source="postgres"}' in text_body
    )
    assert "# TYPE keel_dead_letters gauge" in text_body
