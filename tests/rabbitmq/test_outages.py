"""RabbitMQ stopped, restarted and hung under Keel.

Why: a broker restart (an upgrade, a failover) must not lose or repeat
jobs: Keel's queues are durable quorum queues, so the messages waiting in
them outlive the node; those a worker held when its connection dropped come
back and are refused by the claim if their job already ran. A hung broker
must not hold the API: publishing is bounded, and a job that could not be
published is parked in Postgres and published once the broker answers.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.jobs.intake.bulk import BulkJob, add_bulk
from tests.rabbitmq.conftest import own_node
from tests.support.chaos import add_reports, completed_runs, job_rows, settle, stragglers
from tests.support.client import bearer, unique, wait_state
from tests.support.rabbitmq import queue_depth
from tests.support.stack import wait_for

WAITING = 1000
# No pause between report steps: the thousand jobs drain as fast as the workers go.
FAST_REPORTS = {"KEEL_REPORT_STEP_PAUSE_MS": "0"}


def completed(jobs: dict[str, str]) -> int:
    return sum(1 for row in job_rows(list(jobs)).values() if row["state"] == "completed")


def post_report(client) -> tuple[int, float, str | None]:
    started = time.monotonic()
    response = client.post(
        "/api/v1/reports", json={"reportId": unique(), "rows": 3}, headers=bearer()
    )
    return response.status_code, time.monotonic() - started, response.get_json().get("jobId")


def assert_accepted_in_time(answers: list[tuple[int, float, str | None]]) -> None:
    assert [status for status, _, _ in answers] == [202] * len(answers), answers
    assert max(took for _, took, _ in answers) < 2.0, answers


def assert_ready_reporting_rabbitmq_down(ready) -> None:
    """The API still accepts work (jobs are parked), and says RabbitMQ is not answering."""
    assert ready.status_code == 200, ready.get_json()
    assert ready.get_json()["checks"]["rabbitmq"] != "ok", ready.get_json()


def test_a_node_restart_with_1000_waiting_jobs_completes_each_once(client, spawn, on_rabbitmq):
    node = own_node(on_rabbitmq)
    # Given 1,000 report jobs published to a quorum queue from this process
    queue = unique("rabbit-restart")
    jobs = add_reports(queue, WAITING)
    assert queue_depth(node.url, queue) == WAITING  # every message is in RabbitMQ, not Redis
    # and two workers taking them (and the API's reports), started side by side
    with ThreadPoolExecutor(2) as pool:
        workers = list(
            pool.map(
                lambda _: spawn("restart", queues=f"{queue},reports", extra_env=FAST_REPORTS),
                range(2),
            )
        )
    wait_for(lambda: completed(jobs) >= 30, timeout=60, interval=0.1)
    # When the node is stopped while most of them wait, reports are posted, and it starts again
    done_before = completed(jobs)
    node.stop()
    try:
        answers = [post_report(client) for _ in range(3)]
        ready = client.get("/readyz")
    finally:
        node.start()
    restarted_at = time.monotonic()
    # Then every job completes, each with one completed run and one artifact
    result = settle(jobs, timeout=150)
    took = time.monotonic() - restarted_at
    print(
        f"\nRabbitMQ restart with {WAITING - done_before} of {WAITING} jobs not yet done: "
        f"{result.figure()}; all done {took:.1f} s after the node was back"
    )
    assert result.clean, (result.figure(), stragglers(result))
    rows = job_rows(list(jobs))
    assert [job_id for job_id, row in rows.items() if completed_runs(row) != 1] == []
    # and the workers reconnected by themselves
    assert all(worker.process.poll() is None for worker in workers)
    # And while the node was down, the API accepted reports at once and said it was not ready;
    # they ran once it was back
    assert_accepted_in_time(answers)
    assert_ready_reporting_rabbitmq_down(ready)
    for _, _, job_id in answers:
        assert wait_state(job_id, "completed", timeout=60)


def test_a_hung_node_does_not_hold_the_api_and_parked_jobs_run_after(client, spawn, on_rabbitmq):
    node = own_node(on_rabbitmq)
    spawn("hung", queues="reports")
    # Given the API has published through RabbitMQ already (a pooled connection is open)
    assert post_report(client)[0] == 202
    # When the node is frozen: its sockets stay open and nothing answers
    node.freeze()
    try:
        answers = [post_report(client) for _ in range(6)]
        ready = client.get("/readyz")
    finally:
        node.resume()
    # Then every POST was accepted within 2 s, and readiness reported RabbitMQ down
    assert_accepted_in_time(answers)
    assert_ready_reporting_rabbitmq_down(ready)
    # And once it answers again, every accepted job runs
    for _, _, job_id in answers:
        assert wait_state(job_id, "completed", timeout=60)


def close_every_connection(node) -> None:
    """RabbitMQ closes every client connection, as a restart or a failover does."""
    closed = node.ctl("close_all_connections", "test: connections closed by the broker")
    assert closed.returncode == 0, closed.stderr


def test_a_connection_the_broker_closed_is_replaced_without_parking(on_rabbitmq):
    node = own_node(on_rabbitmq)
    # Given this process has published (its pooled connection is open)
    queue = unique("rabbit-closed")
    first = add_reports(queue, 1)
    # When RabbitMQ closes every client connection
    close_every_connection(node)
    # Then the next job is published at once on a new connection: waiting in the queue,
    # not parked in Postgres for the promoter
    second = add_reports(queue, 1)
    # And so is a batch, published by one producer (its connection replaced in place)
    close_every_connection(node)
    batch = add_bulk([BulkJob("test.echo", {"i": i}, queue) for i in range(3)])
    rows = job_rows([*first, *second, *(job.job_id for job in batch)])
    later = [*second, *(job.job_id for job in batch)]
    assert {job_id: rows[job_id]["state"] for job_id in later} == dict.fromkeys(later, "waiting")
    assert queue_depth(node.url, queue) == 5


@pytest.mark.slow  # a 30 s outage; the node restart above runs by default
def test_a_node_frozen_30_s_under_load_leaves_no_job_behind(spawn, on_rabbitmq):
    node = own_node(on_rabbitmq)
    queue = unique("rabbit-frozen")
    # Given a worker busy with a backlog on RabbitMQ (claiming, finishing, acking)
    spawn("frozen", queues=queue, concurrency=3)
    jobs = add_reports(queue, 90)
    wait_for(lambda: completed(jobs) >= 6, timeout=60, interval=0.2)
    # When the node freezes for 30 s while jobs keep being added (parked: no confirms)
    node.freeze()
    try:
        frozen_at = time.monotonic()
        jobs.update(add_reports(queue, 10))
        time.sleep(max(0.0, 30 - (time.monotonic() - frozen_at)))
    finally:
        node.resume()
    thawed_at = time.monotonic()
    # Then every job completes once within 60 s of the thaw, on the same worker
    result = settle(jobs, timeout=90)
    took = time.monotonic() - thawed_at
    print(f"\nRabbitMQ frozen 30 s under load: {result.figure()}; all done {took:.1f} s after")
    assert result.clean, (result.figure(), stragglers(result))
    assert took < 60, took
