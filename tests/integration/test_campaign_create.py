"""Creating a campaign stores it with its plan job, or not at all (real Postgres and Redis)."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tasks.jobs import Owner
from tasks.notifications import jobs, service
from tasks.platform.db import transaction
from tests.support.client import record, unique
from tests.support.databases import jobs_failing_once

pytestmark = pytest.mark.usefixtures("stack")


def spec(name: str) -> service.NewCampaign:
    return service.NewCampaign(
        name=name,
        category="notice",
        template="hello {seq}",
        recipients=None,
        recipient_count=10,
        chunk_size=5,
    )


def campaigns_named(name: str) -> int:
    with transaction() as session:
        found = session.execute(text("SELECT count(*) FROM campaigns WHERE name = :n"), {"n": name})
        return int(found.scalar_one())


def test_a_plan_job_the_store_refuses_leaves_no_campaign_and_a_retry_makes_one():
    who = Owner(unique("tenant"), "u1")
    name = unique("campaign")
    # Given the database failing the insert of a campaign's plan job once (a deadlock),
    # when a campaign is created
    with jobs_failing_once(f"{jobs.PLAN}:", "40P01"), pytest.raises(OperationalError):
        service.create(who, spec(name))
    # Then nothing of it was stored: no campaign without a plan, none counting on a quota
    assert campaigns_named(name) == 0
    # And creating it again stores it, with its plan job recorded
    campaign = service.create(who, spec(name))
    assert campaigns_named(name) == 1
    plan = record(f"{jobs.PLAN}:{campaign.id}")
    assert plan is not None and plan["state"] in ("waiting", "active", "completed")
