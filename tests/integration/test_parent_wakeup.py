"""A job waiting for its children (``job.add_child`` + ``Defer(..., waiting_children=True)``,
BullMQ's ``moveToWaitingChildren``) runs again when its last child ends: published in
the transaction that records that end, not by its deferral's timer (60 s here)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tasks.jobs import add
from tasks.platform.db import transaction
from tests.support.client import ts, unique, wait_state

pytestmark = pytest.mark.usefixtures("inline_worker")


def children_of(parent: str) -> list[dict]:
    with transaction() as session:
        rows = session.execute(
            text("SELECT id, state, finished_on FROM jobs WHERE parent_job_id = :id"),
            {"id": parent},
        ).all()
    return [{"id": row.id, "state": row.state, "finished_on": row.finished_on} for row in rows]


def test_a_parent_waiting_on_100_children_runs_again_when_the_last_one_ends():
    parent = add("test.fan_out", {"children": 100}, queue="default").job_id
    done = wait_state(parent, "completed", "failed", timeout=40)
    assert done["state"] == "completed", done
    assert done["result"] == {"completed": 100, "failed": 0}
    # It ran twice: the run that added the children and deferred, then the one they woke
    assert [run.get("outcome") for run in done["runs"]] == ["deferred", "completed"]
    assert done["attemptsMade"] == 0
    children = children_of(parent)
    assert len(children) == 100 and {child["state"] for child in children} == {"completed"}
    last_end = max(child["finished_on"] for child in children)
    woken = ts(done["runs"][1]["startedAt"])
    print(f"the parent ran {(woken - last_end).total_seconds():.3f} s after its last child ended")
    assert last_end <= woken
    assert (woken - last_end).total_seconds() < 1.0


def test_a_parent_whose_children_all_ended_before_it_deferred_runs_again_at_once():
    parent = add("test.fan_out", {"children": 3, "deferLate": True}, queue="default").job_id
    done = wait_state(parent, "completed", "failed", timeout=30)
    assert done["result"] == {"completed": 3, "failed": 0}, done
    deferred, again = done["runs"]
    assert deferred["outcome"] == "deferred"
    assert (ts(again["startedAt"]) - ts(deferred["finishedAt"])).total_seconds() < 1.0


def test_children_that_fail_for_good_wake_their_parent_too():
    parent = add(
        "test.fan_out", {"children": 3, "child": "test.unrecoverable"}, queue="default"
    ).job_id
    done = wait_state(parent, "completed", "failed", timeout=30)
    assert done["result"] == {"completed": 0, "failed": 3}, done


def test_a_child_is_its_parents_tenant_s():
    from tasks.jobs import Owner

    owner = Owner(unique("tenant"), "alice")
    parent = add("test.fan_out", {"children": 2}, queue="default", owner=owner).job_id
    done = wait_state(parent, "completed", "failed", timeout=30)
    assert done["result"] == {"completed": 2, "failed": 0}, done
    with transaction() as session:
        tenants = session.execute(
            text("SELECT DISTINCT tenant_id, user_id FROM jobs WHERE parent_job_id = :id"),
            {"id": parent},
        ).all()
    assert [tuple(row) for row in tenants] == [(owner.tenant_id, "alice")]
