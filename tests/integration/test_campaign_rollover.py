"""A generation's rollover, against Postgres: what runs before a generation closes."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tasks.jobs.intake.enqueue import new_job_id
from tasks.notifications import campaigns, generations
from tasks.notifications.models import Campaign
from tasks.platform.db import transaction

pytestmark = pytest.mark.usefixtures("stack")


def _campaign(recipients: int, chunk_size: int, capacity: int) -> Campaign:
    campaign = Campaign(
        id=new_job_id(),
        tenant_id="acme",
        user_id="alice",
        name="rollover",
        category="marketing",
        template="Hi",
        recipient_count=recipients,
        synthetic=True,
        chunk_size=chunk_size,
        chunk_count=recipients // chunk_size,
        capacity=capacity,
        current_generation=0,
    )
    with transaction() as session:
        session.add(campaign)
    campaigns.create_chunks(campaign)
    return campaign


def _seen(campaign_id: str) -> tuple[int, int]:
    """The campaign's current generation and the highest generation a chunk joined."""
    with transaction() as session:
        row = session.execute(
            text(
                "SELECT c.current_generation, "
                "(SELECT coalesce(max(generation), -1) FROM campaign_chunks k "
                " WHERE k.campaign_id = c.id) AS highest "
                "FROM campaigns c WHERE c.id = :c"
            ),
            {"c": campaign_id},
        ).one()
    return row.current_generation, row.highest


def test_before_close_runs_while_the_next_generation_is_still_shut():
    # Given 8 chunks, two per generation
    campaign = _campaign(recipients=8_000, chunk_size=1_000, capacity=2_000)
    calls: list[tuple[int, tuple[int, int]]] = []

    def before_close(generation: int) -> None:
        calls.append((generation, _seen(campaign.id)))

    # When each chunk is assigned in turn
    closed_by = {}
    for chunk_no in range(campaign.chunk_count):
        approval, closed = generations.assign(
            campaign.id, chunk_no, 1_000, campaign.capacity, before_close=before_close
        )
        assert approval.generation == chunk_no // 2
        closed_by[chunk_no] = closed
    # Then a chunk that overflows generation g closes it, and the hook ran first: the
    # campaign was still on g, and no chunk had joined a later generation
    assert [closed_by[k] for k in range(8)] == [[], [], [0], [], [1], [], [2], []]
    assert calls == [(0, (0, 0)), (1, (1, 1)), (2, (2, 2))]


def test_a_failing_hook_leaves_the_generation_open():
    campaign = _campaign(recipients=4_000, chunk_size=1_000, capacity=2_000)
    for chunk_no in range(2):
        generations.assign(campaign.id, chunk_no, 1_000, campaign.capacity)

    def refuse(generation: int) -> None:
        raise RuntimeError("the creator could not be recorded")

    # A hook that raises (its job not recorded) stops the close: the chunk retries later
    with pytest.raises(RuntimeError):
        generations.assign(campaign.id, 2, 1_000, campaign.capacity, before_close=refuse)
    assert generations.readiness(campaign.id, 0).closed is False
    assert _seen(campaign.id) == (0, 0)
