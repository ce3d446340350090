"""``keel schedulers upsert --overlap ... / pause / resume / trigger``, against the real records,
and the firing rules they set, fired in this process (``firing.fire_due``)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from keel.cli import main as keel
from tasks.jobs.model.models import JobRecord, JobSchedulerRecord
from tasks.jobs.schedule import firing
from tasks.jobs.schedule.schedulers import fire_prefix
from tasks.platform.db import transaction
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")
DAY_MS = 86_400_000


def cli(*args: str):
    return CliRunner().invoke(keel, ["schedulers", *args])


def answer(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def jobs_of(scheduler_id: str) -> list[JobRecord]:
    with transaction() as session:
        found = session.scalars(
            select(JobRecord).where(JobRecord.id.startswith(fire_prefix("", scheduler_id)))
        ).all()
    return sorted(found, key=lambda job: job.created_at)


def make_due(scheduler_id: str) -> None:
    """As a beat finds it when its slot has come."""
    with transaction() as session:
        session.execute(
            update(JobSchedulerRecord)
            .where(JobSchedulerRecord.tenant_id == "", JobSchedulerRecord.id == scheduler_id)
            .values(next_run_at=JobSchedulerRecord.next_run_at - timedelta(minutes=5))
        )


def upsert(scheduler_id: str, *options: str) -> dict:
    # A job delayed a day stays live: the overlap policies see it in the way.
    opts = json.dumps({"delay": DAY_MS})
    return answer(cli("upsert", scheduler_id, "--every", "60000", "--name", "test.echo",
                      "--opts", opts, *options))  # fmt: skip


def test_upsert_sets_the_policies_and_list_shows_them():
    scheduler_id = unique("cli")
    shown = upsert(scheduler_id, "--overlap", "skip", "--catch-up", "latest",
                   "--catch-up-window", "5000", "--jitter", "250")  # fmt: skip
    assert shown["overlap"] == "skip" and shown["catchUp"] == "latest"
    assert shown["catchUpWindow"] == 5000 and shown["jitter"] == 250 and shown["paused"] is False
    # An upsert that leaves a policy out sets its default again (a PUT), paused excepted
    again = upsert(scheduler_id)
    assert again["overlap"] == "allow" and again["jitter"] == 0
    listed = [json.loads(line) for line in cli("list").output.splitlines()]
    assert [s["overlap"] for s in listed if s["id"] == scheduler_id] == ["allow"]


def test_a_bad_policy_is_refused_by_name():
    result = cli("upsert", unique("cli"), "--every", "1000", "--name", "test.echo",
                 "--overlap", "queue")  # fmt: skip
    assert result.exit_code == 2 and "--overlap" in result.output


def test_pause_stops_fires_and_resume_gives_a_next_slot():
    scheduler_id = unique("cli")
    upsert(scheduler_id)
    paused = answer(cli("pause", scheduler_id))
    assert paused["paused"] is True and paused["next"] is None
    assert upsert(scheduler_id)["paused"] is True  # an upsert keeps it paused
    firing.fire_due()
    assert jobs_of(scheduler_id) == []
    resumed = answer(cli("resume", scheduler_id))
    assert resumed["paused"] is False and resumed["next"] is not None
    assert cli("pause", "no-such-scheduler").exit_code == 1


def test_skip_drops_a_slot_while_the_last_job_is_live_and_allow_does_not():
    scheduler_id = unique("cli")
    upsert(scheduler_id, "--overlap", "skip")
    # The first fire (a new every scheduler fires at once) adds a job, delayed a day
    firing.fire_due()
    assert len(jobs_of(scheduler_id)) == 1
    # Its next slot comes while that job is live: skipped, and the slot after it is next
    make_due(scheduler_id)
    firing.fire_due()
    assert len(jobs_of(scheduler_id)) == 1
    # Allowed, the next slot adds a second
    upsert(scheduler_id, "--overlap", "allow")
    make_due(scheduler_id)
    firing.fire_due()
    assert len(jobs_of(scheduler_id)) == 2


def test_cancel_cancels_the_live_job_and_adds_the_new_one():
    scheduler_id = unique("cli")
    upsert(scheduler_id, "--overlap", "cancel")
    firing.fire_due()
    make_due(scheduler_id)
    firing.fire_due()
    first, second = jobs_of(scheduler_id)
    assert (first.state, second.state) == ("cancelled", "delayed")


def test_buffer_holds_one_slot_and_trigger_skips_while_one_is_held():
    scheduler_id = unique("cli")
    upsert(scheduler_id, "--overlap", "buffer")
    firing.fire_due()
    make_due(scheduler_id)
    round_ = firing.fire_due()
    assert round_.held == 1 and len(jobs_of(scheduler_id)) == 1
    assert answer(cli("trigger", scheduler_id)) == {"outcome": "skipped", "jobId": None}
    # The live job ends: the held slot fires at the next round
    with transaction() as session:
        [live] = jobs_of(scheduler_id)
        session.execute(update(JobRecord).where(JobRecord.id == live.id).values(state="completed"))
    round_ = firing.fire_due()
    assert round_.held == 0 and len(jobs_of(scheduler_id)) == 2


def test_trigger_adds_a_job_now_without_counting_a_fire():
    scheduler_id = unique("cli")
    upsert(scheduler_id, "--paused")
    fired = answer(cli("trigger", scheduler_id))
    assert fired["outcome"] == "added" and fired["jobId"].startswith(fire_prefix("", scheduler_id))
    shown = [json.loads(line) for line in cli("list").output.splitlines()]
    [mine] = [s for s in shown if s["id"] == scheduler_id]
    assert mine["iterationCount"] == 0 and mine["paused"] is True
    assert cli("trigger", "no-such-scheduler").exit_code == 1
