"""An app's ``beat_schedule`` fired by real beat processes (``tests.support.beat_app``).

Why: Celery's own scheduler fires each entry once per beat process, so two
beats double every job. Keel stores the entries as system job schedulers at
beat start; two beats must still make one job (or one plain Celery message)
per scheduled time, and an entry deleted from the config must stop.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from tasks.jobs.model.models import JobRecord
from tasks.jobs.schedule import schedulers
from tasks.jobs.schedule.schedulers import Scope, fire_prefix
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tasks.reports.schedules import DAILY_CLEANUP_ID
from tests.support.client import unique, wait_state
from tests.support.jobs import BEAT_TICKS_KEY
from tests.support.stack import BeatProcess, wait_for

pytestmark = pytest.mark.usefixtures("worker")
APP = "tests.support.beat_app"
SYNCED = "beat_schedule: "  # the line each beat logs once its entries are stored
WINDOW = timedelta(seconds=10)


def fire_time(task_id: str) -> datetime:
    return datetime.fromtimestamp(int(task_id.rsplit(":", 1)[1]) / 1000, UTC)


def echo_fires() -> list[str]:
    prefix = fire_prefix("", "beat:echo-every-second")
    with transaction() as session:
        return list(
            session.scalars(select(JobRecord.id).where(JobRecord.id.startswith(prefix))).all()
        )


def tick_runs() -> list[str]:
    prefix = fire_prefix("", "beat:tick-every-second")
    ids = [raw.decode() for raw in redis_client().lrange(BEAT_TICKS_KEY, 0, -1)]
    return [task_id for task_id in ids if task_id.startswith(prefix)]


def in_first_window(ids: list[str]) -> list[datetime]:
    times = sorted(fire_time(i) for i in ids)
    return [at for at in times if at < times[0] + WINDOW] if times else []


def start_beat(stack, app: str = APP) -> BeatProcess:
    beat = BeatProcess(stack.home, unique("bs"), app=app)
    beat.start()
    wait_for(lambda: SYNCED in beat.log_path.read_text(errors="replace"), timeout=30)
    return beat


@pytest.fixture
def two_beats(stack):
    beats = [start_beat(stack), start_beat(stack)]
    yield beats
    for beat in beats:
        beat.stop()


def test_two_beats_fire_each_entry_once_per_second(two_beats):
    # Given two beats of an app whose beat_schedule fires a Keel job and a plain task each second
    first = wait_for(echo_fires, timeout=10)
    time.sleep(WINDOW.total_seconds() + 1)
    # Then the job entry made one job per second in ten seconds, all at distinct times
    fires = in_first_window(echo_fires())
    assert 9 <= len(fires) <= 11, fires
    assert len(set(fires)) == len(fires)
    job = wait_state(first[0], "completed")
    assert job["result"] == {"echo": {"from": "beat_schedule"}}
    # And the plain task ran once per second (one run per fire: no fire sent twice)
    wait_for(lambda: len(in_first_window(tick_runs())) >= 9, timeout=10)
    ticks = tick_runs()
    assert len(ticks) == len(set(ticks))
    assert 9 <= len(in_first_window(ticks)) <= 11
    # And the entry that cannot be converted was refused in one clear line, the beats alive
    for beat in two_beats:
        log = beat.log_path.read_text(errors="replace")
        assert (
            "beat_schedule entry 'echo-on-reports' is not scheduled: "
            "test.echo runs on queue 'default', not 'reports'" in log
        )
        assert beat.process.poll() is None


def test_an_entry_deleted_from_the_config_is_gone_after_a_restart(stack):
    # Given a beat that stored the app's entries
    beat = start_beat(stack)
    beat.stop()
    assert schedulers.get(Scope(), "beat:nightly-echo").spec["pattern"] == "30 4 * * *"
    # When beat restarts with "nightly-echo" deleted from beat_schedule
    restarted = start_beat(stack, app="tests.support.beat_app_trimmed")
    restarted.stop()
    # Then its scheduler is gone; the other entries and the system's own schedulers stay
    ids = {record.id for record in schedulers.list_all(Scope())}
    assert "beat:nightly-echo" not in ids
    assert {"beat:echo-every-second", "beat:tick-every-second", DAILY_CLEANUP_ID} <= ids
    assert "1 removed (beat:nightly-echo)" in restarted.log_path.read_text()
    schedulers.remove_system_except("beat:", set())  # nothing fires them once beats are gone
