"""Where a job's message lands among its queue's priority lists (kombu's Redis priorities).

A job goes behind what its party (its tenant, or the system) already has on
its queue — also when it was recorded first and woken later by a canvas (a
campaign's chord over its chunks) — at or before its own rank: a call's ``priority=``
orders the party's own jobs — and a control job (``handler(control=True)``:
a campaign's group creation, sends, finalizer) goes to the front whatever
its party's load. Read on a queue no worker consumes, so the lists stay put.
"""

from __future__ import annotations

import uuid

import pytest
from celery import chain, chord
from sqlalchemy import text

from tasks.jobs import Owner, acting_as, add
from tasks.jobs.calls.celery_task import wake_if_waiting
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.intake.tenancy import PRIORITY_STEPS
from tasks.jobs.store import upkeep
from tasks.notifications.jobs import CREATE
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.broker_lists import messages_in
from tests.support.jobs import echo

pytestmark = pytest.mark.usefixtures("stack")


def ids_in(queue: str, priority: int) -> set[str]:
    """The job ids of the messages waiting in one of ``queue``'s priority lists."""
    return {message["headers"]["id"] for message in messages_in(queue, priority)}


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


def lists_of(queue: str, ids: list[str]) -> list[int]:
    """The priority list each of ``ids`` waits in, in order."""
    where = {job_id: step for step in PRIORITY_STEPS for job_id in ids_in(queue, step)}
    return [where[job_id] for job_id in ids]


def test_a_call_s_priority_orders_its_tenant_s_own_jobs_and_keeps_another_s_places(idle_queue):
    # Given a tenant with a backfill of 20 jobs sent at Redis's lowest priority (9), and a
    # second tenant's job sent after them
    a = Owner(f"tenant-{uuid.uuid4().hex[:8]}", "backfill")
    b = Owner(f"tenant-{uuid.uuid4().hex[:8]}", "someone")
    with acting_as(a):
        backfill = [
            echo.apply_async(kwargs={"n": i}, queue=idle_queue, priority=9).id for i in range(20)
        ]
    with acting_as(b):
        first_of_b = echo.apply_async(kwargs={"n": 0}, queue=idle_queue).id
    # When the first tenant sends four calls without a priority (Redis: 0, the most urgent)
    with acting_as(a):
        urgent = [echo.apply_async(kwargs={"n": i}, queue=idle_queue).id for i in range(4)]
    # Then its urgent calls take the tenant's first turns, ahead of its own backfill's
    # later jobs, as if the backfill were not there
    assert lists_of(idle_queue, urgent) == [0, 3, 3, 3]
    assert lists_of(idle_queue, backfill) == [0, 3, 3, 3] + [6] * 12 + [9] * 4
    # And they take no other tenant's turn: they get exactly what the second tenant's
    # first four jobs get, which the backfill never pushed back
    with acting_as(b):
        more_of_b = [echo.apply_async(kwargs={"n": i}, queue=idle_queue).id for i in range(3)]
    assert lists_of(idle_queue, [first_of_b, *more_of_b]) == [0, 3, 3, 3]
    # And the record keeps the call's priority and its rank
    with transaction() as session:
        kept = dict(
            session.execute(
                text("SELECT id, priority FROM jobs WHERE id = ANY(:ids)"),
                {"ids": [backfill[0], urgent[0]]},
            ).all()
        )
    assert kept == {backfill[0]: 9, urgent[0]: 0}


def test_a_priority_that_is_not_a_whole_number_is_refused_by_the_call(idle_queue):
    with pytest.raises(ValueError, match="priority must be a whole number"):
        echo.apply_async(kwargs={}, queue=idle_queue, priority="high")
    with transaction() as session:
        assert not session.execute(
            text("SELECT 1 FROM jobs WHERE queue = :q"), {"q": idle_queue}
        ).first()


def test_a_promoted_job_keeps_its_rank(idle_queue):
    # Given a tenant's backfill waiting at priority 9, and two delayed calls: one urgent
    # (no priority: Redis's first), one more of the backfill
    a = Owner(f"tenant-{uuid.uuid4().hex[:8]}", "backfill")
    with acting_as(a):
        for i in range(20):
            echo.apply_async(kwargs={"n": i}, queue=idle_queue, priority=9)
        urgent = echo.apply_async(kwargs={}, queue=idle_queue, countdown=3600).id
        late = echo.apply_async(kwargs={}, queue=idle_queue, countdown=3600, priority=9).id
    # When they fall due and are promoted
    with transaction() as session:
        ready = upkeep.promote_now(session, [urgent, late])
        publish_ready(session, ready)
    # Then each goes where an add of its priority would: the urgent one ahead of the
    # backfill, the other behind it
    assert urgent in ids_in(idle_queue, 0)
    assert late in ids_in(idle_queue, PRIORITY_STEPS[-1])


def rank_of(job_id: str) -> int:
    with transaction() as session:
        found: int = session.execute(
            text("SELECT priority FROM jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    return found


def test_a_chord_body_keeps_its_priority(idle_queue):
    # When a chord is sent whose body asks for priority 9 (its parts wait: nobody consumes)
    body = echo.s().set(queue=idle_queue, priority=9)
    result = chord([echo.s(n=1).set(queue=idle_queue)], body).apply_async()
    # Then the body's record, waiting for its parts, holds that rank for when it is sent
    assert rank_of(result.id) == 9


def test_a_chain_step_s_priority_that_is_not_a_whole_number_is_refused_by_the_call(idle_queue):
    # A chain's later steps are recorded only when the step before them ends: a priority
    # they cannot take is refused now, not when it would fail the step that ran
    steps = chain(echo.s(n=1).set(queue=idle_queue), echo.si(n=2).set(priority="high"))
    with pytest.raises(ValueError, match="priority must be a whole number"):
        steps.apply_async()
    with transaction() as session:
        assert not session.execute(
            text("SELECT 1 FROM jobs WHERE queue = :q"), {"q": idle_queue}
        ).first()
