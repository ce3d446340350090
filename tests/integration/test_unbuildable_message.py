"""A record no message can be built from (data that is not an object, recorded by an earlier
release's Python ``add``) does not hold back the jobs published with it (real Postgres and
Redis): it is set aside for an hour, said in an error log, and the rest of its batch goes;
an operator's edit of its data then lets it run."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.intake import edits, messages, promote
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.observe import events
from tasks.jobs.store import upkeep
from tasks.platform import broker
from tasks.platform.db import transaction
from tests.support import broker_lists
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def record_of(job_id: str) -> dict:
    with transaction() as session:
        query = text(
            "SELECT state, data, EXTRACT(EPOCH FROM run_at - clock_timestamp()) AS due_in_s "
            "FROM jobs WHERE id = :id"
        )
        return dict(session.execute(query, {"id": job_id}).mappings().one())


def waiting_events(queue: str) -> set[str]:
    return {e["jobId"] for e in events.read([queue]) if e["event"] == "waiting"}


def test_a_record_no_message_can_be_built_from_does_not_hold_back_its_batch(idle_queue, caplog):
    # Given four delayed jobs of a tenant, one holding a list as its data
    owner = Owner(unique("tenant"), "planner")
    delayed = JobOptions(delay=60_000)
    ids = [
        add("test.echo", {"n": n}, queue=idle_queue, opts=delayed, owner=owner).job_id
        for n in range(4)
    ]
    good, bad = ids[:3], ids[3]
    with transaction() as session:
        session.execute(text("UPDATE jobs SET data = '[1, 2]'::jsonb WHERE id = :id"), {"id": bad})
    # When they are promoted and published together
    with caplog.at_level(logging.ERROR, logger=promote.__name__), transaction() as session:
        sent = publish_ready(session, upkeep.promote_now(session, ids), announce_waiting=True)
    # Then the others are published, waiting and announced, and only they count as sent
    assert sorted(job.id for job in sent) == sorted(good)
    assert set(good) <= set(broker_lists.headers_in(idle_queue))
    assert all(record_of(job_id)["state"] == "waiting" for job_id in good)
    assert waiting_events(idle_queue) & set(ids) == set(good)
    # And the one no message can be built from is set aside for an hour, and said so
    held = record_of(bad)
    assert held["state"] == "delayed" and 3000 < held["due_in_s"] <= 3600
    assert bad not in broker_lists.headers_in(idle_queue)
    said = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    assert said and "not an object but list" in said[0]
    assert not broker.publish_unreachable()
    # When an operator replaces its data and promotes it, it is published like the others
    edits.update_data(bad, owner, {"n": 3}, actor="operator", reason="was a list")
    edits.promote(bad, owner, actor="operator", tenant_wide=True)
    assert record_of(bad)["state"] == "waiting"
    assert bad in broker_lists.headers_in(idle_queue)


def test_a_batch_whose_messages_fail_to_build_for_another_reason_is_parked_briefly(
    idle_queue, caplog, monkeypatch
):
    # Given due jobs, and message building broken by something other than their records
    def broken(*args, **kwargs):
        raise TypeError("a bug, not a record")

    monkeypatch.setattr(messages, "_as_task_v2", lambda settings: broken)
    ids = [
        add("test.echo", {"n": n}, queue=idle_queue, opts=JobOptions(delay=60_000)).job_id
        for n in range(2)
    ]
    # When they are promoted and published together
    with caplog.at_level(logging.ERROR, logger=promote.__name__), transaction() as session:
        sent = publish_ready(session, upkeep.promote_now(session, ids))
    # Then nothing is sent, every job is parked for a second (not an hour), and the error
    # is logged as what it is, not as the broker being away
    assert sent == []
    assert all(record_of(job_id)["due_in_s"] <= promote.PARK_S for job_id in ids)
    assert any("could not be built" in r.getMessage() and r.exc_info for r in caplog.records)
    assert not broker.publish_unreachable()
