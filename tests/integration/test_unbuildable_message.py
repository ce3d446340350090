"""A record whose message cannot be built (data that is not an object, recorded by an earlier
release's Python ``add``) does not hold back the jobs published with it (real Postgres and
Redis): it is set aside for an hour, said in an error log, and the rest of its batch goes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tasks import broker
from tasks.db import transaction
from tasks.jobs import JobOptions, add
from tasks.jobs.intake import promote
from tests.support import broker_lists

pytestmark = pytest.mark.usefixtures("stack")


@pytest.fixture
def idle_queue() -> Iterator[str]:
    with broker_lists.idle_queue("unbuildable") as queue:
        yield queue


def record_of(job_id: str) -> dict:
    with transaction() as session:
        query = text(
            "SELECT state, EXTRACT(EPOCH FROM run_at - clock_timestamp()) AS due_in_s "
            "FROM jobs WHERE id = :id"
        )
        return dict(session.execute(query, {"id": job_id}).mappings().one())


def test_a_job_whose_message_cannot_be_built_does_not_hold_back_its_batch(idle_queue, caplog):
    # Given two due delayed jobs, one of them holding a list as its data
    good = [
        add("test.echo", {"n": n}, queue=idle_queue, opts=JobOptions(delay=1)).job_id
        for n in range(3)
    ]
    bad = add("test.echo", {}, queue=idle_queue, opts=JobOptions(delay=1)).job_id
    with transaction() as session:
        session.execute(text("UPDATE jobs SET data = '[1, 2]'::jsonb WHERE id = :id"), {"id": bad})
    time.sleep(0.05)
    # When the promoter publishes what is due
    with caplog.at_level(logging.ERROR, logger="tasks.jobs.intake.promote"):
        assert promote.promote_once() >= 4
    # Then the others are published and waiting
    published = broker_lists.headers_in(idle_queue)
    assert set(good) <= set(published) and bad not in published
    assert all(record_of(job_id)["state"] == "waiting" for job_id in good)
    # And the one that cannot be built is set aside for an hour, and said so
    held = record_of(bad)
    assert held["state"] == "delayed" and 3000 < held["due_in_s"] <= 3600
    assert any(bad in r.getMessage() and "mapping" in r.getMessage() for r in caplog.records)
    assert not broker.publish_unreachable()
