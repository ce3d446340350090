"""No set of one tenant's schedulers keeps another's from firing: a round of ``fire_due``
fires the due slots that can fire before it looks at slots held by ``overlap: buffer``, and
a scheduler catching up a backlog (``catchUp: all``) yields to one on time. Fired in this
process, one round at a time, with a window (``limit``) as small as the crowd."""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from keel.cli import main as keel
from tasks.jobs.model.models import JobRecord, JobSchedulerRecord
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule import firing, schedulers
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope, db_now, fire_prefix
from tasks.platform.db import transaction
from tests.support.client import bearer, unique

pytestmark = pytest.mark.usefixtures("stack")
CROWD = 20  # one tenant's schedulers, as many as a round's window
DAY_MS = 86_400_000


def jobs_of(tenant: str, scheduler_id: str) -> list[JobRecord]:
    with transaction() as session:
        return list(
            session.scalars(
                select(JobRecord).where(JobRecord.id.startswith(fire_prefix(tenant, scheduler_id)))
            )
        )


def add(tenant: str, spec: SchedulerSpec) -> str:
    scheduler_id = unique(tenant)
    schedulers.upsert(Scope(tenant, "ops"), scheduler_id, spec)
    return scheduler_id


def due_since(tenant: str, ids: list[str], ago: timedelta) -> None:
    """Their slot came ``ago``, as a beat finds them then."""
    with transaction() as session:
        now = db_now(session)
        session.execute(
            update(JobSchedulerRecord)
            .where(JobSchedulerRecord.tenant_id == tenant, JobSchedulerRecord.id.in_(ids))
            .values(next_run_at=now - ago)
        )


def end_jobs(tenant: str, scheduler_id: str) -> None:
    with transaction() as session:
        session.execute(
            update(JobRecord)
            .where(JobRecord.id.startswith(fire_prefix(tenant, scheduler_id)))
            .values(state="completed")
        )


def buffered(tenant: str, count: int) -> list[str]:
    """``count`` buffered schedulers of ``tenant`` that fired once: each one's job is live
    (delayed a day, nothing runs it), so each next slot is held."""
    template = JobTemplate(name="test.echo", opts={"delay": DAY_MS})
    spec = SchedulerSpec(every=1000, overlap="buffer", template=template)
    ids = [add(tenant, spec) for _ in range(count)]
    firing.fire_due(limit=10 * count)  # a new every scheduler fires at once
    assert all(len(jobs_of(tenant, i)) == 1 for i in ids)
    return ids


@pytest.fixture(autouse=True)
def _alone():
    """Each test's schedulers are the only ones due (a fresh database, and cleared after)."""
    yield
    with transaction() as session:
        session.execute(update(JobSchedulerRecord).values(next_run_at=None, held_since=None))


def test_held_slots_do_not_keep_another_tenants_scheduler_from_firing():
    # Given a tenant whose buffered schedulers fill a round's window, each slot held
    held = buffered("tenant-a", CROWD)
    due_since("tenant-a", held, timedelta(minutes=5))
    assert firing.fire_due(limit=CROWD).held == CROWD
    # And another tenant's plain scheduler whose slot has come (after theirs)
    other = add("tenant-b", SchedulerSpec(every=60_000, template=JobTemplate(name="test.echo")))
    # When beat fires a round, and another
    first = firing.fire_due(limit=CROWD)
    # Then the other tenant's scheduler fired at once; the held slots still wait
    assert len(jobs_of("tenant-b", other)) == 1
    assert [len(jobs_of("tenant-a", i)) for i in held] == [1] * CROWD
    assert first.held == CROWD
    # And a held slot fires once its last job ends
    end_jobs("tenant-a", held[0])
    firing.fire_due(limit=CROWD)
    assert len(jobs_of("tenant-a", held[0])) == 2


def test_a_held_slot_whose_job_ended_fires_behind_more_held_slots_than_a_round_takes():
    # Given a tenant's held slots, older than another tenant's held slot, more than a round
    crowd = buffered("tenant-a", CROWD)
    [mine] = buffered("tenant-c", 1)
    due_since("tenant-a", crowd, timedelta(minutes=5))
    due_since("tenant-c", [mine], timedelta(minutes=1))
    firing.fire_due(limit=CROWD + 1)  # all held
    # When the other tenant's last job ends
    end_jobs("tenant-c", mine)
    firing.fire_due(limit=CROWD)
    # Then its held slot fires at the next round
    assert len(jobs_of("tenant-c", mine)) == 2


def test_a_catch_up_backlog_does_not_keep_a_scheduler_on_time_from_firing():
    # Given a tenant's schedulers catching up every missed slot of the last 50 minutes
    spec = SchedulerSpec(
        every=1000, catchUp="all", catchUpWindow=3_600_000, template=JobTemplate(name="test.echo")
    )
    behind = [add("tenant-a", spec) for _ in range(CROWD)]
    due_since("tenant-a", behind, timedelta(minutes=50))
    # And another tenant's scheduler whose slot comes now
    other = add("tenant-b", SchedulerSpec(every=60_000, template=JobTemplate(name="test.echo")))
    # When beat fires a round
    firing.fire_due(limit=CROWD)
    # Then the scheduler on time fired, and the backlog goes on with the rest of the round
    assert len(jobs_of("tenant-b", other)) == 1
    assert sum(len(jobs_of("tenant-a", i)) for i in behind) == CROWD - 1


# --- catchUp: all is bounded by a window -------------------------------------------------------


def test_catch_up_all_needs_a_window():
    with pytest.raises(ValueError, match="catchUpWindow"):
        SchedulerSpec(every=1000, catchUp="all", template=JobTemplate(name="test.echo"))


def test_the_api_refuses_catch_up_all_without_a_window_naming_it(client):
    scheduler_id, operator = unique("all"), bearer(roles=("operator",))
    url = f"/api/v1/schedulers/{scheduler_id}"
    body = {"every": 1000, "catchUp": "all", "template": {"name": "test.echo"}}
    response = client.put(url, json=body, headers=operator)
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["error"] == "validation_failed"
    assert "catchUpWindow is required" in str(response.get_json()["details"])
    windowed = client.put(url, json={**body, "catchUpWindow": 60_000}, headers=operator)
    assert windowed.status_code == 200 and windowed.get_json()["catchUpWindow"] == 60_000
    client.delete(url, headers=operator)


def test_the_cli_refuses_catch_up_all_without_a_window():
    result = CliRunner().invoke(
        keel,
        ["schedulers", "upsert", unique("all"), "--every", "1000", "--name", "test.echo",
         "--catch-up", "all"],
    )  # fmt: skip
    assert result.exit_code == 2 and "--catch-up-window" in result.output
