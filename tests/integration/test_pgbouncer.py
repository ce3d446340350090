"""Keel behind PgBouncer in transaction pooling (``KEEL_DATABASE_POOLER=transaction``).

A real ``pgbouncer`` (Debian's) in front of the suite's Postgres, with ``pool_mode =
transaction`` and without ``ignore_startup_parameters``: it refuses a connection that sends
libpq's startup ``options``, so every connection of Keel's here proves it sends none. This
test process, a worker, beat and the API served by gunicorn all reach Postgres through it
alone; the core scenarios run as they do directly, and the timeouts Keel depends on are in
force on the pooled connections, set by each transaction for itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import requests
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tasks import health
from tasks.jobs import Backoff, JobOptions, Owner, add
from tasks.jobs.intake.bulk import BulkJob, add_bulk
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule import schedulers
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope
from tasks.platform import db
from tasks.platform.config import reload_settings
from tasks.platform.db import request_scope, run_alone, transaction
from tasks.reports.jobs import GENERATE
from tasks.reports.jobs import QUEUE as REPORTS
from tasks.reports.operation_key import operation_key
from tasks.reports.service import report_options
from tests.support.client import bearer, unique, wait_state, waits_between_runs
from tests.support.inline import join
from tests.support.pgbouncer import PgBouncer
from tests.support.stack import BeatProcess, WebProcess, WorkerProcess, wait_for
from web.ui.session import issue_link

pytestmark = pytest.mark.stack  # starts processes of its own
QUEUE = unique("pooled")  # the pooled worker's queue: no other worker of the suite takes it
PAGE = {"Accept": "text/html"}


def direct_url() -> str:
    """The suite's Postgres itself, past PgBouncer."""
    return os.environ["KEEL_DIRECT_TEST_DATABASE_URL"]


@pytest.fixture(scope="module")
def bouncer(stack) -> Iterator[PgBouncer]:
    """PgBouncer in front of the suite's Postgres; for the module, Keel's database URL here
    (this process's and every process it starts) is PgBouncer's, in transaction mode."""
    pooler = PgBouncer(stack.home / "pgbouncer", os.environ["KEEL_DATABASE_URL"])
    pooler.start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEEL_DIRECT_TEST_DATABASE_URL", os.environ["KEEL_DATABASE_URL"])
        patch.setenv("KEEL_DATABASE_URL", pooler.url)
        patch.setenv("KEEL_DATABASE_POOLER", "transaction")
        reload_settings()
        db.dispose()
        try:
            yield pooler
        finally:
            db.dispose()
    reload_settings()
    pooler.stop()


@pytest.fixture(scope="module")
def pooled_worker(bouncer, stack) -> Iterator[WorkerProcess]:
    # Its own queue, the default one (a tenant's scheduler of test.echo fires there) and
    # the reports' (the API's).
    queues = f"{QUEUE},default,{REPORTS}"
    process = WorkerProcess(stack.home, unique("pooled"), concurrency=2, queues=queues)
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def web(bouncer, stack) -> Iterator[WebProcess]:
    process = WebProcess(stack.home)
    process.start()
    yield process
    process.stop()


def test_keel_connects_without_startup_options_and_each_transaction_sets_its_timeouts(bouncer):
    # Given Keel's connections through a PgBouncer that refuses startup options
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        psycopg.connect(bouncer.url, options="-c statement_timeout=1000").close()
    # Then a transaction of a worker's (the background engine) runs under Keel's timeouts
    with transaction() as session:
        statement = session.execute(text("SHOW statement_timeout")).scalar()
        idle = session.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
    assert (statement, idle) == ("0", f"{int(db.IDLE_IN_TRANSACTION_S)}s")
    # and so does an API request's (its statement timeout is the request's deadline),
    # a single statement's included, however often the same statement is sent (psycopg
    # prepares none: the next server connection would not have it)
    with request_scope():
        with transaction(one_statement=True) as session:
            assert session.execute(text("SHOW statement_timeout")).scalar() == "1s"
        shown = text("SELECT current_setting(:name) AS value")
        for _ in range(8):
            assert run_alone(shown, {"name": "statement_timeout"}) == {"value": "1s"}
    # while Postgres's own defaults, which a session of its own would get, are not Keel's
    with psycopg.connect(direct_url(), autocommit=True) as conn:
        row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert row is not None and row[0] == "0"
    # and the health check's probe passes through it too
    assert health._postgres() == (None, "ok")


def test_a_lock_held_by_a_client_gone_quiet_is_released_by_idle_in_transaction_timeout(
    bouncer, monkeypatch
):
    # Given Keel's idle-in-transaction timeout shortened to 1 s (35 s in production) for
    # this process's new connections
    monkeypatch.setattr(db, "IDLE_IN_TRANSACTION_S", 1.0)
    db.dispose()
    key = int(time.time() * 1000) % 2**31
    try:
        # When a pooled transaction takes a transaction lock, then its client says nothing
        with pytest.raises(DBAPIError) as ended, transaction() as session:
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            with psycopg.connect(direct_url(), autocommit=True) as other:
                taken = "SELECT pg_try_advisory_xact_lock(%s)"
                assert other.execute(taken, (key,)).fetchone() == (False,)
                # Then Postgres ends that transaction and the lock is free again
                wait_for(lambda: other.execute(taken, (key,)).fetchone() == (True,), timeout=10)
            # and the client learns it on its next statement, from Postgres
            session.execute(text("SELECT 1"))
        assert ended.value.orig.sqlstate == "25P03", ended.value  # idle_in_transaction_timeout
    finally:
        db.dispose()  # the next tests' connections get the production timeout again


def test_jobs_are_added_claimed_and_retried_with_backoff_through_the_pooler(pooled_worker):
    # Given a worker whose every connection goes through PgBouncer
    owner = Owner("acme", "alice")
    # When jobs are added one by one and in bulk, and one fails twice with a fixed backoff
    one = [add("test.echo", {"i": i}, queue=QUEUE, owner=owner).job_id for i in range(10)]
    bulk = [a.job_id for a in add_bulk([BulkJob("test.echo", {"b": i}, QUEUE) for i in range(50)])]
    failing = add(
        "test.always_fails",
        {},
        queue=QUEUE,
        opts=JobOptions(attempts=3, backoff=Backoff(type="fixed", delay=300)),
    ).job_id
    # Then each is claimed and run once, and the failing one runs three times, 0.3 s apart
    jobs = join([*one, *bulk], timeout=60)
    assert {job["state"] for job in jobs.values()} == {"completed"}
    assert {job["attemptsStarted"] for job in jobs.values()} == {1}
    assert jobs[one[3]]["result"] == {"echo": {"i": 3}}
    failed = wait_state(failing, "failed", timeout=30)
    assert (failed["attemptsMade"], failed["failedReason"]) == (3, "plain failure on run 3")
    assert all(0.3 - 0.05 <= wait <= 0.3 + 1.0 for wait in waits_between_runs(failed)), failed
    # and the worker, with no direct URL, said once that it does not LISTEN
    assert pooled_worker.log_path.read_text().count("not listening for committed jobs") == 1


def test_a_stalled_run_is_recovered_through_the_pooler(bouncer, stack):
    # Given a worker, reaching Postgres through PgBouncer, killed after its run stored its
    # artifact and before the run was recorded complete
    queue = unique("pooledcrash")
    victim = WorkerProcess(
        stack.home, unique("victim"), concurrency=1, queues=queue,
        extra_env={"KEEL_LOCK_DURATION_S": "2"},
    )  # fmt: skip
    victim.start()
    report_id = unique()
    key = operation_key("acme", "alice", report_id, 3)
    data = {"reportId": report_id, "rows": 3, "crashAfterStoreOnRun": 1}
    added = add(GENERATE, data, queue=queue, opts=report_options(key), owner=Owner("acme", "alice"))
    wait_for(lambda: victim.process.poll() is not None, timeout=30)
    # When another worker starts on its queue
    rescuer = WorkerProcess(stack.home, unique("rescuer"), concurrency=1, queues=queue)
    rescuer.start()
    try:
        # Then the stall is found and the job runs again, reusing the stored artifact
        job = wait_state(added.job_id, "completed", timeout=30)
    finally:
        rescuer.stop()
    assert job["result"]["reused"] is True
    assert (job["attemptsStarted"], job["stalledCount"]) == (2, 1)


def test_a_scheduler_fires_through_beat_behind_the_pooler(pooled_worker, stack):
    # Given a tenant's scheduler of three fires, 300 ms apart
    scheduler_id = unique("pooled-every")
    spec = SchedulerSpec(every=300, limit=3, template=JobTemplate(name="test.echo"))
    schedulers.upsert(Scope("acme"), scheduler_id, spec)
    # When beat runs, through PgBouncer
    beat = BeatProcess(stack.home, unique("pooled"))
    beat.start()
    try:
        # Then it fires three jobs, and the worker runs them
        prefix = schedulers.fire_prefix("acme", scheduler_id)

        def fired() -> list[str]:
            with transaction() as session:
                ids = session.execute(
                    text("SELECT id FROM jobs WHERE id LIKE :p"), {"p": prefix + "%"}
                ).scalars()
                return list(ids)

        ids = wait_for(lambda: len(found := fired()) == 3 and found, timeout=30)
    finally:
        beat.stop()
    assert {job["state"] for job in join(ids, timeout=30).values()} == {"completed"}


def test_the_api_the_dashboard_and_a_bulk_action_through_the_pooler(pooled_worker, web):
    # Given the API served by gunicorn, its connections through PgBouncer
    tenant = unique("t")
    ops = bearer(tenant, "ops", ("operator",))
    later = JobOptions(delay=86_400_000)
    delayed = [
        add("test.echo", {}, queue=QUEUE, owner=Owner(tenant, "alice"), opts=later).job_id
        for _ in range(5)
    ]
    # When an operator cancels the queue's delayed jobs by filter
    asked = {"action": "cancel", "filter": {"queue": QUEUE}, "reason": "behind the pooler"}
    started = requests.post(f"{web.url}/api/v1/bulk-actions", json=asked, headers=ops, timeout=10)
    assert started.status_code == 202, started.text
    status_url = requests.compat.urljoin(web.url, started.json()["statusUrl"])

    def done() -> dict | None:
        now = requests.get(status_url, headers=ops, timeout=10).json()
        return now if now["state"] == "done" else None

    # Then the workers do it, and each job is cancelled
    assert wait_for(done, timeout=30)["done"] == 5
    assert {wait_state(job_id, "cancelled")["state"] for job_id in delayed} == {"cancelled"}
    # and the dashboard's jobs page lists them
    browser = requests.Session()
    link = issue_link(os.environ["KEEL_SECRET_KEY"], tenant, "ops", ["operator"], 60)
    signed = browser.get(f"{web.url}/ui/login/{link}", allow_redirects=False, timeout=10)
    assert signed.status_code == 303, signed.text
    page = browser.get(f"{web.url}/ui/jobs?queue={QUEUE}", headers=PAGE, timeout=10)
    assert page.status_code == 200 and delayed[0] in page.text, page.text[-2000:]


def test_a_pooler_restart_costs_503s_while_it_is_away_and_no_job(bouncer, pooled_worker, web):
    reports = f"{web.url}/api/v1/reports"
    alice = bearer()
    # Given a report recorded due 1 s from now
    run_at = datetime.now(UTC) + timedelta(seconds=1)
    due = requests.post(
        f"{reports}/scheduled",
        json={"reportId": unique(), "rows": 3, "runAt": run_at.isoformat()},
        headers=alice,
        timeout=10,
    )
    assert due.status_code == 202, due.text
    # When PgBouncer stops until after that report was due
    bouncer.stop()
    try:
        # Then the API answers 503 while it is away
        away = requests.post(reports, json={"reportId": unique(), "rows": 3}, headers=alice)
        assert away.status_code == 503, away.text
        wait_for(lambda: datetime.now(UTC) > run_at + timedelta(seconds=1), timeout=5)
    finally:
        bouncer.start()  # on the same port
    # and once it is back, reports are accepted again, and both run once
    back = requests.post(reports, json={"reportId": unique(), "rows": 3}, headers=alice)
    assert back.status_code == 202, back.text
    jobs = join([due.json()["jobId"], back.json()["jobId"]], timeout=30)
    assert {(job["state"], job["attemptsStarted"]) for job in jobs.values()} == {("completed", 1)}


def test_a_wait_marks_its_job_and_hears_its_end_through_the_pooler(pooled_worker):
    from tasks.jobs.calls.result_backend import FALLBACK_POLL_S
    from tests.support.jobs import celery_add

    # A caller's wait marks its job in its first read (a write, through the pooler), and the
    # worker that completes it tells the caller: no wait for the fallback read
    result = celery_add.apply_async((20, 22), countdown=1)
    started = time.monotonic()
    assert result.get(timeout=30) == 42
    assert time.monotonic() - started < FALLBACK_POLL_S - 1
    with transaction() as session:
        watched = session.execute(
            text("SELECT watched FROM jobs WHERE id = :id"), {"id": result.id}
        ).scalar_one()
    assert watched is True
