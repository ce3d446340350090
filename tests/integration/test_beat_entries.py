"""``beat_schedule`` entries stored as system schedulers, and fired (real Postgres and Redis).

What a beat start does (``beat_entries.sync``) and what a tick does with the
rows (``firing.fire_due``), in this process; the same with real beat
processes is in ``tests/integration/test_beat_schedule.py``.
"""

from __future__ import annotations

import base64
import json
import logging
from contextlib import contextmanager

import pytest
from celery.schedules import crontab
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tasks.celery import app
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule import beat_entries, firing, schedulers, standing
from tasks.jobs.schedule.beat import KeelScheduler
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope, fire_job_id
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.chaos import priority_lists
from tests.support.client import unique
from tests.support.databases import jobs_failing_once

pytestmark = pytest.mark.usefixtures("stack")


@contextmanager
def beat_schedule(entries: dict):
    before = app.conf.beat_schedule
    app.conf.beat_schedule = entries
    try:
        yield
    finally:
        app.conf.beat_schedule = before


def system_ids(prefix: str = beat_entries.PREFIX) -> set[str]:
    return {r.id for r in schedulers.list_all(Scope()) if r.id.startswith(prefix)}


def test_entries_are_upserted_refused_and_removed_by_name(caplog):
    # Given a config with a good entry, a plain task entry and one that cannot be converted
    entries = {
        "echo": {"task": "test.echo", "schedule": 60.0, "kwargs": {"n": 1}},
        "ping": {"task": "elsewhere.ping", "schedule": crontab(minute=0), "args": [1]},
        "bad": {"task": "test.echo", "schedule": 60.0, "options": {"queue": "reports"}},
    }
    with (
        caplog.at_level(logging.INFO, logger="tasks.jobs.schedule.beat_entries"),
        beat_schedule(entries),
    ):
        synced = beat_entries.sync(app)
    # Then the good ones are system schedulers, and the bad one is one error line naming it
    assert system_ids() == {"beat:echo", "beat:ping"}
    assert synced.refused == ["bad"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "beat_schedule entry 'bad' is not scheduled: test.echo runs on queue 'default', "
        "not 'reports'"
    ]
    echo = schedulers.get(Scope(), "beat:echo")
    assert echo.spec["every"] == 60_000 and echo.spec["template"]["data"] == {"n": 1}
    ping = schedulers.get(Scope(), "beat:ping")
    assert ping.spec["pattern"] == "0 * * * *"
    assert ping.spec["celeryMessage"] == {"args": [1], "kwargs": {}, "options": {}}
    first_fire = echo.next_run_at
    # When beat starts again without "ping" (and with "echo" unchanged)
    with beat_schedule({"echo": entries["echo"]}):
        synced = beat_entries.sync(app)
    # Then ping's scheduler is gone, echo keeps its next fire, other system schedulers stay
    assert synced.removed == ["beat:ping"]
    assert system_ids() == {"beat:echo"}
    assert schedulers.get(Scope(), "beat:echo").next_run_at == first_fire
    # And an empty beat_schedule removes them all
    with beat_schedule({}):
        beat_entries.sync(app)
    assert system_ids() == set()


def make_due(scheduler_id: str) -> None:
    with transaction() as session:
        session.execute(
            text(
                "UPDATE job_schedulers SET next_run_at = date_trunc('second', now()) "
                "WHERE tenant_id = '' AND id = :id"
            ),
            {"id": scheduler_id},
        )


def test_a_plain_entry_sends_one_celery_message_per_fire():
    # Given a plain task entry whose messages go to a queue no worker reads
    queue = unique("plain")
    entries = {
        "plain": {
            "task": "elsewhere.report",
            "schedule": 3600,
            "args": [7],
            "kwargs": {"k": "v"},
            "options": {"queue": queue},
        }
    }
    with beat_schedule(entries):
        beat_entries.sync(app)
    make_due("beat:plain")
    at = schedulers.get(Scope(), "beat:plain").next_run_at
    # When two rounds of firing run (the second finds nothing due)
    first, second = firing.fire_due(), firing.fire_due()
    # Then one message was sent: the task by name, its args, kwargs and options, no job record
    assert first.job_ids == second.job_ids == [] and first.unsent == 0
    raw = [m for name in priority_lists(queue) for m in redis_client().lrange(name, 0, -1)]
    assert len(raw) == 1
    message = json.loads(raw[0])
    assert message["headers"]["task"] == "elsewhere.report"
    assert message["headers"]["id"] == fire_job_id("", "beat:plain", at)
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == ([7], {"k": "v"})
    with transaction() as session:
        assert session.execute(text("SELECT count(*) FROM jobs")).scalar() == 0
    record = schedulers.get(Scope(), "beat:plain")
    assert record.iteration_count == 1 and record.next_run_at > at
    with beat_schedule({}):
        beat_entries.sync(app)


@pytest.mark.parametrize("sqlstate", ["40P01", "55P03", "57014"])  # deadlock, lock, statement
def test_a_fire_the_database_fails_for_now_stays_due_and_fires_next_round(sqlstate, caplog):
    # Given a job scheduler that is due, and the database failing its fire's insert once
    entry = f"flaky-{sqlstate}"
    scheduler = f"beat:{entry}"
    with beat_schedule({entry: {"task": "test.echo", "schedule": 3600.0}}):
        beat_entries.sync(app)
    make_due(scheduler)
    at = schedulers.get(Scope(), scheduler).next_run_at
    with jobs_failing_once(schedulers.fire_prefix("", scheduler), sqlstate):
        # When a round of firing meets the error
        with caplog.at_level(logging.WARNING, logger="tasks.jobs.schedule.schedulers"):
            first = firing.fire_due()
        # Then nothing fired, the scheduler is not parked, its fire is still due, and the
        # round says a fire is left for the next one
        assert first.job_ids == [] and first.unsent == 1
        record = schedulers.get(Scope(), scheduler)
        assert record.next_run_at == at and record.iteration_count == 0
        assert any(f"{scheduler} did not fire; retrying" in r.getMessage() for r in caplog.records)
        # And the next round fires that same time, once
        second = firing.fire_due()
    assert second.job_ids == [fire_job_id("", scheduler, at)]
    record = schedulers.get(Scope(), scheduler)
    assert record.iteration_count == 1 and record.next_run_at > at
    with beat_schedule({}):
        beat_entries.sync(app)


def test_a_fire_the_database_refuses_every_time_parks_its_scheduler(caplog):
    # Given a due scheduler whose fire meets an error that is no passing one (54000:
    # a program limit exceeded, one of OperationalError's classes all the same)
    scheduler = "beat:refused"
    with beat_schedule({"refused": {"task": "test.echo", "schedule": 3600.0}}):
        beat_entries.sync(app)
    make_due(scheduler)
    # When a round of firing meets it
    with (
        jobs_failing_once(schedulers.fire_prefix("", scheduler), "54000"),
        caplog.at_level(logging.ERROR, logger="tasks.jobs.schedule.schedulers"),
    ):
        first = firing.fire_due()
    # Then the scheduler is parked, not tried again at every tick for ever
    assert first.job_ids == [] and first.unsent == 0
    assert schedulers.get(Scope(), scheduler).next_run_at is None
    assert any(f"{scheduler} could not fire; parked" in r.getMessage() for r in caplog.records)
    with beat_schedule({}):
        beat_entries.sync(app)


def test_saving_a_parked_scheduler_again_gives_it_a_next_fire_unless_its_limit_is_reached():
    # Given a beat entry's scheduler and a scheduler whose limit of one fire is reached,
    # both with no next fire (parked, and done)
    with beat_schedule({"revived": {"task": "test.echo", "schedule": 60.0}}):
        beat_entries.sync(app)
    done = SchedulerSpec(every=60_000, limit=1, template=JobTemplate(name="test.echo"))
    schedulers.upsert(Scope(), "done-once", done)
    with transaction() as session:
        session.execute(
            text(
                "UPDATE job_schedulers SET next_run_at = NULL, "
                "iteration_count = CASE WHEN id = 'done-once' THEN 1 ELSE 0 END "
                "WHERE tenant_id = '' AND id IN ('beat:revived', 'done-once')"
            )
        )
    # When beat starts again (the same entry), and the done one is saved again unchanged
    with beat_schedule({"revived": {"task": "test.echo", "schedule": 60.0}}):
        beat_entries.sync(app)
    schedulers.upsert(Scope(), "done-once", done)
    # Then the parked one fires again, and the done one stays done
    revived = schedulers.get(Scope(), "beat:revived")
    assert revived.next_run_at is not None and revived.iteration_count == 0
    assert schedulers.get(Scope(), "done-once").next_run_at is None
    schedulers.remove(Scope(), "done-once")
    with beat_schedule({}):
        beat_entries.sync(app)


def test_a_standing_scheduler_that_fails_at_beat_start_is_set_up_at_a_later_tick(monkeypatch):
    # Given an app's standing scheduler whose first set-up meets a database that is away
    calls: list[int] = []
    spec = SchedulerSpec(every=3_600_000, template=JobTemplate(name="test.echo"))

    def ensure() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("INSERT", {}, Exception("the database is away"))
        schedulers.upsert(Scope(), "standing-test", spec)

    # (the only one: the apps' own would add schedulers that the ticks below fire)
    monkeypatch.setattr(standing, "_declared", {"standing-test": ensure})
    # When beat starts
    beat = KeelScheduler(app=app)
    # Then the set-up was tried, and beat went on without the scheduler
    assert len(calls) == 1
    assert "standing-test" not in {r.id for r in schedulers.list_all(Scope())}
    # And the next tick sets it up, and no tick after that tries again
    beat.tick()
    assert len(calls) == 2
    assert schedulers.get(Scope(), "standing-test").next_run_at is not None
    beat.tick()
    assert len(calls) == 2
    schedulers.remove(Scope(), "standing-test")
