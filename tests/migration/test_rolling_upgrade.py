"""A rolling upgrade from the previous release to this checkout, with work in flight.

docs/operations/upgrading.md is the procedure: ``keel db upgrade`` while the
previous release's workers run, then the new release's processes beside the
old, then the old ones stopped with SIGTERM. This test does exactly that,
with both releases' real processes on one database and one broker:

- the previous release (``PREVIOUS``, pinned by commit; its tree comes from this
  clone's history with ``git archive``) is migrated, runs a worker and beat,
  and puts work in flight: report jobs (some failing their first run, so
  their retry waits in the delayed set), long jobs, delayed jobs, a chord
  half done, and a scheduler firing every second;
- ``keel db upgrade`` of this checkout runs under the old worker;
- this checkout then adds the same kinds of work, which the old worker claims
  and runs (nothing else consumes yet): records and messages written by the
  new release, read by the old one;
- this checkout's worker and beat start, the old beat and worker get SIGTERM
  (the worker finishes what it runs), and the new worker finishes what is
  left: jobs recorded and messages written by the old release.

Pass: every job completes, each with exactly one completed run; no report
artifact is stored twice; each chord body runs once with every part's
result; the scheduler fired under both releases and every fire completed.

Both releases run from the same virtualenv: a release's tree goes first on
``PYTHONPATH`` (and is the working directory), ahead of the editable install.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from tasks.jobs.schedule.schedulers import SYSTEM, fire_prefix
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tests.support import kept_logs
from tests.support.chaos import completed_runs, job_rows, settle, stragglers
from tests.support.databases import _admin, _named, using
from tests.support.releases import PREVIOUS, previous_tree
from tests.support.stack import PROJECT_ROOT, wait_for

# A release check (the previous release installed beside this one): the slow tier.
pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEDULER = "upgrade-tick"
WORK = (PROJECT_ROOT / "tests" / "support" / "upgrade_work.py").read_text()


class Release:
    """One release's processes: its tree first on the path, the test's database and broker."""

    def __init__(
        self, name: str, tree: Path, env: dict[str, str], logs: Path, scheduler: str
    ) -> None:
        self.name, self.tree, self.logs, self.scheduler = name, tree, logs, scheduler
        self.env = {**env, "PYTHONPATH": str(tree)}
        self.processes: list[subprocess.Popen] = []

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=self.tree,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{self.name}: {args[:2]} failed:\n{done.stderr[-3000:]}"
        return done.stdout

    def keel(self, *args: str) -> str:
        return self.run("-c", "import sys; from keel.cli import main; sys.exit(main())", *args)

    def put_work(self) -> dict:
        return json.loads(self.run("-c", WORK, self.name).strip().splitlines()[-1])

    def start(self, role: str, *args: str, ready: str) -> subprocess.Popen:
        log = self.logs / f"{self.name}-{role}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks", role, *args],
            cwd=self.tree,
            env=self.env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)

        def started() -> bool:
            assert process.poll() is None, f"{self.name} {role} exited:\n{log.read_text()[-3000:]}"
            return ready in log.read_text(errors="replace")

        wait_for(started, timeout=60, interval=0.2)
        return process

    def worker(self) -> subprocess.Popen:
        return self.start(
            "worker",
            "-I",
            "tests.support.jobs",
            "-n",
            f"{self.name}@%h",
            "-c",
            "2",
            "-l",
            "INFO",
            "--without-mingle",
            "--without-gossip",
            ready=" ready.",
        )

    def beat(self) -> subprocess.Popen:
        schedule = self.logs / f"{self.name}-beat-schedule"
        return self.start(
            "beat",
            "-l",
            "INFO",
            "-S",
            self.scheduler,
            "--pidfile=",
            "-s",
            str(schedule),
            ready="beat: Starting",
        )

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def stop_gracefully(process: subprocess.Popen, timeout: float = 60) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=timeout)


@pytest.fixture
def upgrade_env(stack, tmp_path) -> Iterator[tuple[dict[str, str], str]]:
    """A database and a Redis database of the test's own, on the session's servers: no
    session worker consumes what the two releases publish here."""
    session = get_settings()
    assert session.database_url and session.redis_url
    name = f"keel_upgrade_{uuid.uuid4().hex[:10]}"
    _admin(session.database_url, f"CREATE DATABASE {name}")
    database_url = _named(session.database_url, name)
    redis_url = session.redis_url.rsplit("/", 1)[0] + "/7"
    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "KEEL_HOME": str(home),
        "KEEL_DATABASE_URL": database_url,
        "KEEL_REDIS_URL": redis_url,
        "KEEL_LOCK_DURATION_S": "10",
        "KEEL_JOB_MODULES": "tests.support.jobs",  # the CLI knows test.echo for the scheduler
    }
    env.pop("KEEL_BROKER_URL", None)
    try:
        yield env, database_url
    finally:
        broker.flushdb()
        _admin(session.database_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def revision() -> str:
    with transaction() as session:
        return str(session.execute(text("SELECT version_num FROM alembic_version")).scalar_one())


def fires() -> dict[str, dict]:
    """The scheduler's fired jobs: id → state, runs and when it was recorded."""
    with transaction() as session:
        rows = session.execute(
            text("SELECT id, state, runs, created_at FROM jobs WHERE id LIKE :prefix"),
            {"prefix": f"{fire_prefix(SYSTEM, SCHEDULER)}%"},
        ).all()
    return {row.id: {"state": row.state, "runs": row.runs, "at": row.created_at} for row in rows}


def scheduler_row() -> dict | None:
    with transaction() as session:
        row = session.execute(
            text(
                "SELECT next_run_at, iteration_count, last_run_at FROM job_schedulers "
                "WHERE id = :id"
            ),
            {"id": SCHEDULER},
        ).first()
    return dict(row._mapping) if row is not None else None


def clock() -> datetime:
    with transaction() as session:
        now: datetime = session.execute(text("SELECT clock_timestamp()")).scalar_one()
    return now


def ran_on(row: dict, release: str) -> bool:
    return any(str(run.get("worker", "")).startswith(f"{release}@") for run in row["runs"])


def test_a_rolling_upgrade_from_the_previous_release_finishes_every_job_once(upgrade_env, tmp_path):
    env, database_url = upgrade_env
    logs = tmp_path / "logs"
    logs.mkdir()
    # Beat's scheduler class moved with the layered packages: each release names its own.
    old = Release(
        "old", previous_tree(tmp_path / "previous"), env, logs, "tasks.jobs.beat:KeelScheduler"
    )
    new = Release("new", PROJECT_ROOT, env, logs, "tasks.jobs.schedule.beat:KeelScheduler")
    try:
        with using(database_url):
            # Given the previous release migrated, with a worker, beat and a scheduler
            old.keel("db", "upgrade")
            previous_head = revision()
            old.keel("schedulers", "upsert", SCHEDULER, "--every", "1000", "--name", "test.echo")
            old_worker = old.worker()
            old_beat = old.beat()
            # and its work in flight: reports (some to be retried), long jobs, delayed
            # jobs, a chord
            put_old = old.put_work()
            wait_for(lambda: any(f["state"] == "completed" for f in fires().values()), 30)
            chord_parts_done = lambda: sum(  # noqa: E731
                1
                for row in job_rows_by_name("test.celery_part", "old").values()
                if row["state"] == "completed"
            )
            wait_for(lambda: chord_parts_done() >= 1, timeout=30)
            assert chord_parts_done() < 6, "the chord finished before the upgrade began"

            # When this checkout's migrations run under the old worker
            new.keel("db", "upgrade")
            head = revision()
            assert head != previous_head, "this release adds no migration to run under load"
            # and this checkout adds the same kinds of work, while only the old worker runs
            put_new = new.put_work()
            new_ids = [*put_new["reports"], *put_new["sleeps"]]
            wait_for(
                lambda: any(
                    ran_on(row, "old") and row["state"] == "completed"
                    for row in job_rows(new_ids).values()
                ),
                timeout=60,
            )
            # and this checkout's worker and beat start beside the old ones, which then
            # get SIGTERM (the worker finishes what it runs)
            new.worker()
            new.beat()
            assert stop_gracefully(old_beat) == 0
            old_beat_stopped = clock()
            assert stop_gracefully(old_worker) == 0

            # Then every report completes once, with one artifact per operation key
            reports = {**put_old["reports"], **put_new["reports"]}
            result = settle(reports, timeout=90)
            assert result.clean, (result.figure(), stragglers(result))
            # and every other job too: long, delayed, chord parts and bodies
            others = [*put_old["sleeps"], *put_new["sleeps"]]
            others += [*put_old["delayed"], *put_new["delayed"]]
            bodies = [put_old["chord_body"], put_new["chord_body"]]
            parts = {**job_rows_by_name("test.celery_part", "old")}
            parts.update(job_rows_by_name("test.celery_part", "new"))
            assert len(parts) == 12, sorted(parts)
            everything = [*others, *bodies, *parts]

            def all_finished() -> bool:
                rows = job_rows(everything)
                return len(rows) == len(everything) and all(
                    row["state"] in ("completed", "failed", "cancelled") for row in rows.values()
                )

            wait_for(all_finished, timeout=90, interval=0.5)
            rows = job_rows(everything)
            not_once = {
                job: (row["state"], completed_runs(row))
                for job, row in rows.items()
                if row["state"] != "completed" or completed_runs(row) != 1
            }
            assert not_once == {}, not_once
            # and each chord body ran once, with every part's result
            for body in bodies:
                indexes = [part["index"] for part in rows[body]["result"]["results"]]
                assert indexes == list(range(6)), rows[body]["result"]
            # Both releases read each other's work: the old worker ran jobs the new release
            # recorded, the new worker ran jobs the old release recorded
            assert any(ran_on(rows[j], "old") for j in put_new["sleeps"] + list(parts))
            old_recorded = job_rows([*put_old["reports"], *put_old["delayed"]])
            assert any(ran_on(row, "new") for row in old_recorded.values())
            # and the scheduler fired under both beats, each fire completed once
            fired_since = lambda: sum(f["at"] > old_beat_stopped for f in fires().values())  # noqa: E731
            try:
                wait_for(lambda: fired_since() >= 2, timeout=15)
            except AssertionError:
                raise AssertionError(
                    f"{fired_since()} fires since the old beat stopped; scheduler: "
                    f"{scheduler_row()}; new beat running: {new.processes[-1].poll() is None}"
                ) from None
            fired = fires()
            assert any(f["at"] < old_beat_stopped for f in fired.values())
            unfinished = {
                job: f["state"]
                for job, f in fired.items()
                if f["state"] != "completed" and f["runs"]
            }
            assert unfinished == {}, unfinished
            print(
                f"\nrolling upgrade {PREVIOUS} ({previous_head}) → this checkout ({head}): "
                f"{result.figure()}; {len(everything)} other jobs completed once; "
                f"{len(fired)} scheduler fires"
            )
    finally:
        new.stop_all()
        old.stop_all()
        kept_logs.keep(logs, "rolling-upgrade")  # both releases' worker and beat logs
        shutil.rmtree(tmp_path / "previous", ignore_errors=True)


def job_rows_by_name(name: str, label: str) -> dict[str, dict]:
    """Jobs of ``name`` put in flight by ``label``'s release (their args carry the label)."""
    with transaction() as session:
        found = session.execute(
            text("SELECT id FROM jobs WHERE name = :name AND data::text LIKE :label"),
            {"name": name, "label": f'%"{label}"%'},
        ).all()
    return job_rows([row.id for row in found])
