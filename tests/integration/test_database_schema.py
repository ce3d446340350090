"""Keel's tables in a schema of their own (``KEEL_DATABASE_SCHEMA``), beside another app's.

The database already holds the other app's ``public.jobs`` (other columns, a row of its
own). Keel's migrations, its worker (a real ``celery worker``), its adds, deduplication,
per-state counters (triggers) and a caller's transaction whose search path is ``public``
all work in schema ``keel``, and so do the README's core scenarios (a report and its
artifact, retries with backoff, an operator's audited retry, a delayed job, a scheduler's
fires); the other app's table is as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from tasks.jobs import Backoff, Deduplication, JobOptions, Owner, add, in_transaction
from tasks.jobs.intake.manual_retry import RetryRequest, retry
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule import firing, schedulers
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope
from tasks.jobs.store.counts import counts
from tasks.platform import db
from tasks.platform.config import get_settings, reload_settings
from tasks.platform.migrate import migrate
from tasks.reports.jobs import GENERATE
from tasks.reports.operation_key import operation_key
from tasks.reports.service import report_options
from tests.support.client import record, ts, unique, wait_state, waits_between_runs
from tests.support.databases import fresh_database
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.stack  # starts a worker of its own

SCHEMA = "keel"
QUEUE = unique("schema")  # consumed by this module's worker alone
THEIRS = [(1, "their own row", "kept")]


def _settings_changed() -> None:
    with db._lock:  # as tests.support.databases.using: no engine made meanwhile
        reload_settings()
        db.dispose()


def _theirs(engine) -> tuple[list, list]:
    """The other app's table: its rows and its columns."""
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM public.jobs ORDER BY id")).all()
        columns = connection.execute(
            text(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = 'jobs' ORDER BY ordinal_position"
            )
        ).scalars()
        return [tuple(row) for row in rows], list(columns)


@pytest.fixture(scope="module")
def their_engine(stack) -> Iterator:
    """A database whose ``public.jobs`` is another app's, Keel migrated into ``keel`` beside
    it, a worker of Keel's on it; the other app's engine (its search path: ``public``)."""
    with fresh_database(template=None), pytest.MonkeyPatch.context() as patch:
        engine = create_engine(get_settings().sqlalchemy_url)
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE jobs (id int PRIMARY KEY, title text, s text)"))
            connection.execute(text("INSERT INTO jobs VALUES (1, 'their own row', 'kept')"))
        patch.setenv("KEEL_DATABASE_SCHEMA", SCHEMA)
        _settings_changed()
        worker = WorkerProcess(stack.home, unique("schema"), concurrency=2, queues=QUEUE)
        try:
            migrate()
            migrate()  # again: nothing to do, the version table is found in Keel's schema
            worker.start()
            yield engine
        finally:
            worker.stop()
            engine.dispose()
            patch.undo()
            _settings_changed()
    _settings_changed()


def test_migrations_make_keels_tables_in_its_schema_and_leave_the_other_apps_table(
    their_engine,
):
    with their_engine.connect() as connection:
        ours = set(
            connection.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": SCHEMA}
            ).scalars()
        )
        public = set(
            connection.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ).scalars()
        )
        functions = set(
            connection.execute(
                text(
                    "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "WHERE n.nspname = :s"
                ),
                {"s": SCHEMA},
            ).scalars()
        )
    assert {"jobs", "job_counts", "job_count_deltas", "alembic_version"} <= ours
    assert public == {"jobs"}  # the other app's, and nothing of Keel's
    assert {"jobs_count_added", "jobs_count_states", "keel_admit_job"} <= functions
    assert _theirs(their_engine) == (THEIRS, ["id", "title", "s"])


def test_jobs_run_deduplicate_and_are_counted_in_keels_schema(their_engine):
    # Given jobs added by Keel (one of them twice, under a deduplication id)
    first = add("test.echo", {"n": 1}, queue=QUEUE)
    rule = JobOptions(deduplication=Deduplication(id=unique("dedup")))
    kept = add("test.echo", {"n": 2}, queue=QUEUE, opts=rule)
    again = add("test.echo", {"n": 3}, queue=QUEUE, opts=rule)
    # Then the duplicate added nothing
    assert (kept.created, again.created, again.job_id) == (True, False, kept.job_id)
    # and the worker runs each job once, from Keel's schema
    for added, n in ((first, 1), (kept, 2)):
        done = wait_state(added.job_id, "completed", "failed", timeout=30)
        assert (done["state"], done["result"]) == ("completed", {"echo": {"n": n}}), done
    # and the triggers counted them in Keel's schema
    assert wait_for(lambda: counts(QUEUE)["completed"] == 2, timeout=10)
    with their_engine.connect() as connection:
        in_keel = connection.execute(
            text(f"SELECT count(*) FROM {SCHEMA}.jobs WHERE queue = :q"), {"q": QUEUE}
        ).scalar_one()
    assert in_keel == 2
    assert _theirs(their_engine) == (THEIRS, ["id", "title", "s"])


def test_a_callers_session_on_public_records_in_keels_schema_and_reads_its_own_after(
    their_engine,
):
    with Session(their_engine) as session:
        with in_transaction(session):
            job_id = add("test.echo", {"caller": "session"}, queue=QUEUE).job_id
        # The caller's own statements after Keel's still read the caller's tables
        assert session.execute(text("SHOW search_path")).scalar_one() == '"$user", public'
        assert session.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 1
        assert record(job_id) is None  # not committed yet
        session.commit()
    done = wait_state(job_id, "completed", timeout=30)
    assert done["result"] == {"echo": {"caller": "session"}}
    assert _theirs(their_engine) == (THEIRS, ["id", "title", "s"])


def test_a_callers_psycopg_connection_on_public_records_in_keels_schema(their_engine):
    url = their_engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as connection:
        with in_transaction(connection):
            job_id = add("test.echo", {"caller": "psycopg"}, queue=QUEUE).job_id
        assert connection.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
        connection.commit()
    done = wait_state(job_id, "completed", timeout=30)
    assert done["result"] == {"echo": {"caller": "psycopg"}}
    assert _theirs(their_engine) == (THEIRS, ["id", "title", "s"])


def _in_keels_schema(engine, sql: str, **params) -> int:
    with engine.connect() as connection:
        return connection.execute(text(sql.format(schema=SCHEMA)), params).scalar_one()


def test_the_readmes_core_scenarios_run_in_keels_schema(their_engine):
    owner = Owner("acme", "alice")
    # Given a report (its artifact stored with INSERT ... ON CONFLICT), a job failing with
    # exponential backoff, and a delayed job, all on Keel's worker
    report_id = unique()
    key = operation_key("acme", "alice", report_id, 3)
    report = add(
        GENERATE,
        {"reportId": report_id, "rows": 3},
        queue=QUEUE,
        opts=report_options(key),
        owner=owner,
    )
    backoff = Backoff(type="exponential", delay=200)
    failing = add(
        "test.always_fails", {}, queue=QUEUE, opts=JobOptions(attempts=3, backoff=backoff)
    )
    later = add("test.echo", {"later": True}, queue=QUEUE, opts=JobOptions(delay=1000))
    # Then the report completes with its artifact in Keel's schema
    done = wait_state(report.job_id, "completed", "failed", timeout=60)
    assert done["state"] == "completed", done
    artifacts = "SELECT count(*) FROM {schema}.report_artifacts WHERE operation_key = :key"
    assert _in_keels_schema(their_engine, artifacts, key=key) == 1
    # and the failing job ran three times, 0.2 s then 0.4 s apart, and failed
    failed = wait_state(failing.job_id, "failed", timeout=30)
    assert failed["attemptsMade"] == 3, failed
    waits = waits_between_runs(failed)
    assert 0.15 <= waits[0] <= 1.5 and 0.35 <= waits[1] <= 2.0, waits
    # and an operator's retry gives it its three attempts again, audited in Keel's schema
    retry(RetryRequest(failing.job_id, None, None, actor="ops", reason="upstream fixed now"))

    twice = ["retrying", "retrying", "failed", "manual-retry", "retrying", "retrying", "failed"]

    def failed_again() -> dict | None:
        job = record(failing.job_id)
        # a run still in progress has no outcome yet
        return job if [run.get("outcome") for run in job["runs"]] == twice else None

    assert wait_for(failed_again, timeout=30)["state"] == "failed"
    audits = "SELECT count(*) FROM {schema}.job_retry_audit WHERE job_id = :id"
    assert _in_keels_schema(their_engine, audits, id=failing.job_id) == 1
    # and the delayed job ran no sooner than its delay
    ran = wait_state(later.job_id, "completed", timeout=30)
    assert ts(ran["processedOn"]) - ts(ran["createdAt"]) >= timedelta(seconds=1), ran
    # and a scheduler fires its jobs (as beat's tick does) into Keel's schema
    scheduler_id = unique("every")
    parked = JobOptions(delay=86_400_000)  # (recorded, not run: no worker here runs default)
    spec = SchedulerSpec(every=200, limit=2, template=JobTemplate(name="test.echo", opts=parked))
    schedulers.upsert(Scope("acme"), scheduler_id, spec)
    fired = "SELECT count(*) FROM {schema}.jobs WHERE id LIKE :prefix"
    prefix = schedulers.fire_prefix("acme", scheduler_id) + "%"

    def fires() -> int:
        firing.fire_due()
        return _in_keels_schema(their_engine, fired, prefix=prefix)

    assert wait_for(lambda: fires() == 2, timeout=20)
    assert _theirs(their_engine) == (THEIRS, ["id", "title", "s"])
