"""A job's ``waiting`` event is in its queue's stream before a worker can claim it.

The promoter (and a caller transaction's publish, a lifted pause) publishes jobs inside
the transaction that makes them waiting; a worker's claim waits for that commit. Sent
after the commit, a fast worker's ``active`` could come first (``tasks.jobs.intake.promote``).
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from tasks.jobs import JobOptions, add
from tasks.jobs.intake import promote
from tasks.jobs.observe import events
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def test_the_promoters_waiting_event_goes_before_its_commit():
    # Given a delayed job whose time has come
    queue = unique("promoted")
    job_id = add("test.echo", {}, queue=queue, opts=JobOptions(delay=1)).job_id
    time.sleep(0.05)
    seen_at_commit: list[list[str]] = []

    def look(session: Session) -> None:
        found = [e["event"] for e in events.read([queue]) if e["jobId"] == job_id]
        seen_at_commit.append(found)

    # When the promoter promotes it, with the stream read just before its commit
    event.listen(Session, "before_commit", look)
    try:
        assert promote.promote_once() >= 1
    finally:
        event.remove(Session, "before_commit", look)
    # Then its waiting event was there before the transaction that made it waiting ended
    assert seen_at_commit and seen_at_commit[-1][-1:] == ["waiting"], seen_at_commit
    assert [e["event"] for e in events.read([queue]) if e["jobId"] == job_id][-1] == "waiting"
