"""Workflow failure policies and parents woken by their children, on two worker processes of
concurrency 4 (the same checks on the fast tier's inline worker:
``test_chord_failure_policies.py``, ``test_chain_failure_policies.py``,
``test_parent_wakeup.py``, ``test_job_waits.py``)."""

from __future__ import annotations

import pytest
from celery import chain, chord
from sqlalchemy import text

from tasks.jobs import add
from tasks.platform.db import transaction
from tests.support.client import ts, unique, wait_state
from tests.support.jobs import celery_add, celery_autoretry_all, celery_collect, celery_got
from tests.support.stack import worker_pair

pytestmark = pytest.mark.stack  # starts processes of its own

QUEUE = unique("flows")
REASON = "this input can never succeed"


@pytest.fixture(scope="module")
def workers(stack):
    """Two worker processes of concurrency 4 each, on the module's queue."""
    with worker_pair(stack.home, unique("flows"), QUEUE) as started:
        yield started


def chord_of_ten(policy: str):
    """8 parts adding (n + n) and 2 failing for good, at places 3 and 7."""
    parts = [
        (celery_autoretry_all.si() if n in (3, 7) else celery_add.si(n, n)).set(queue=QUEUE)
        for n in range(10)
    ]
    return chord(parts)(celery_collect.s().set(queue=QUEUE, on_child_failure=policy))


def test_a_chord_of_ten_with_two_failing_parts_by_each_policy(workers):
    results = {policy: chord_of_ten(policy) for policy in ("fail", "ignore", "remove")}
    bodies = {
        policy: wait_state(result.id, "completed", "failed", timeout=60)
        for policy, result in results.items()
    }
    # fail: the body fails without running
    assert (bodies["fail"]["state"], bodies["fail"]["attemptsStarted"]) == ("failed", 0)
    # ignore: it runs once, with 10 entries, the failures as errors in their places
    ignored = bodies["ignore"]
    assert (ignored["state"], ignored["attemptsStarted"]) == ("completed", 1), ignored
    entries = ignored["result"]["results"]
    assert len(entries) == 10
    assert [n for n, entry in enumerate(entries) if isinstance(entry, dict)] == [3, 7]
    assert all(entries[n]["error"] == REASON for n in (3, 7))
    # remove: it runs once, with the 8 results
    removed = bodies["remove"]
    assert (removed["state"], removed["attemptsStarted"]) == ("completed", 1), removed
    assert removed["result"]["results"] == [n + n for n in range(10) if n not in (3, 7)]


def test_a_chain_goes_on_past_a_failed_step_by_its_policy(workers):
    result = chain(
        celery_autoretry_all.si().set(queue=QUEUE),
        celery_got.s("x").set(queue=QUEUE, on_child_failure="ignore"),
    )()
    got = wait_state(result.id, "completed", "failed", timeout=30)
    assert got["result"] == {
        "args": [{"error": REASON, "jobId": result.parent.id}, "x"],
        "kwargs": {},
    }


def test_a_parent_waiting_on_100_children_is_published_when_the_last_ends(workers):
    # Given a parent adding 100 children and deferring with a 60 s backstop
    parent = add("test.fan_out", {"children": 100}, queue=QUEUE).job_id
    done = wait_state(parent, "completed", "failed", timeout=90)
    assert done["result"] == {"completed": 100, "failed": 0}, done
    assert [run.get("outcome") for run in done["runs"]] == ["deferred", "completed"]
    with transaction() as session:
        last_end = session.execute(
            text("SELECT max(finished_on) FROM jobs WHERE parent_job_id = :id"), {"id": parent}
        ).scalar_one()
    woken = ts(done["runs"][1]["startedAt"])
    print(f"the parent ran {(woken - last_end).total_seconds():.3f} s after its last child ended")
    assert last_end <= woken
    assert (woken - last_end).total_seconds() < 1.0
