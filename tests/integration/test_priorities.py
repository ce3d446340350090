"""Where a job's message lands among its queue's priority lists (kombu's Redis priorities).

A job goes behind what its party (its tenant, or the system) already has on
its queue — also when it was recorded first and woken later by a canvas (a
campaign's chord over its chunks) — and a control job (``handler(control=True)``:
a campaign's group creation, sends, finalizer) goes to the front whatever
its party's load. Read on a queue no worker consumes, so the lists stay put.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tasks.broker import redis_client
from tasks.db import transaction
from tasks.jobs import Owner, add
from tasks.jobs.calls.celery_task import wake_if_waiting
from tasks.jobs.intake.tenancy import PRIORITY_STEPS
from tasks.notifications.jobs import CREATE

pytestmark = pytest.mark.usefixtures("stack")

SEP = "\x06\x16"  # kombu's separator between a queue's name and its priority


def ids_in(queue: str, priority: int) -> set[str]:
    """The job ids of the messages waiting in one of ``queue``'s priority lists."""
    key = queue if priority == 0 else f"{queue}{SEP}{priority}"
    return {json.loads(raw)["headers"]["id"] for raw in redis_client().lrange(key, 0, -1)}


@pytest.fixture
def idle_queue() -> Iterator[str]:
    queue = f"idle-{uuid.uuid4().hex[:10]}"
    yield queue
    redis_client().delete(queue, *(f"{queue}{SEP}{p}" for p in PRIORITY_STEPS if p))
    with transaction() as session:
        session.execute(text("DELETE FROM jobs WHERE queue = :q"), {"q": queue})


def test_a_canvas_wake_up_queues_behind_its_tenant_s_load(idle_queue):
    # Given 20 jobs of one tenant recorded without a message (as a campaign's chunks are)
    owner = Owner(f"tenant-{uuid.uuid4().hex[:8]}", "planner")
    ids = [
        add("test.echo", {"n": i}, queue=idle_queue, owner=owner, publish_now=False).job_id
        for i in range(20)
    ]
    # When a canvas wakes them (a chord's header sent over recorded jobs)
    for job_id in ids:
        wake_if_waiting(job_id, {})
    # Then each message goes behind the tenant's 20 waiting jobs, as 20 adds' would,
    # not to the front where it would hold every other tenant's next job behind it
    assert ids_in(idle_queue, PRIORITY_STEPS[-1]) == set(ids)
    assert ids_in(idle_queue, 0) == set()


def test_a_control_job_goes_to_the_front_whatever_its_party_s_load(idle_queue):
    # Given a queue where the system's jobs already wait deep enough for the back list
    bulk = [add("test.echo", {"n": i}, queue=idle_queue).job_id for i in range(20)]
    assert ids_in(idle_queue, PRIORITY_STEPS[-1]) & set(bulk)
    # When a control job of the same party is added (a campaign's group creation)
    control = add(CREATE, {"campaignId": "c-prio", "generation": 0}, queue=idle_queue).job_id
    # Then it waits in the front list, ahead of the bulk it unblocks
    assert control in ids_in(idle_queue, 0)
    # And woken again by a canvas, it still goes to the front
    redis_client().delete(idle_queue)
    wake_if_waiting(control, {})
    assert ids_in(idle_queue, 0) == {control}
