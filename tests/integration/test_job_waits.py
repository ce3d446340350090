"""A job waiting for other jobs than its children (``Defer(..., waiting_for=[...])``: a
campaign's chunk waiting for its generation's group creator, which many chunks share)
runs again when the last of them ends: published in the transaction that records that
end, not by its deferral's timer (60 s here)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tasks.jobs import Defer, JobOptions, add
from tasks.jobs.end.cancel import cancel
from tasks.jobs.store import waits
from tasks.platform.db import transaction
from tests.support.client import record, ts, unique, wait_state
from tests.support.stack import wait_for

pytestmark = pytest.mark.usefixtures("inline_worker")


def held(tmp_path: Path) -> tuple[str, Path]:
    """A running job held until its file exists."""
    until = tmp_path / unique("until")
    job_id = add("test.hold", {"until": str(until), "maxMs": 30_000}, queue="default").job_id
    wait_state(job_id, "active")
    return job_id, until


def test_a_job_waiting_for_two_others_runs_again_when_the_last_ends(tmp_path):
    (first, first_until), (second, second_until) = held(tmp_path), held(tmp_path)
    waiter = add("test.await_jobs", {"jobs": [first, second]}, queue="default").job_id
    wait_for(lambda: record(waiter)["state"] == "waiting-children", timeout=10)
    # When one of them ends, it still waits for the other
    first_until.touch()
    wait_state(first, "completed")
    time.sleep(0.5)
    assert record(waiter)["state"] == "waiting-children"
    # When the other ends, it runs again at once
    second_until.touch()
    last = wait_state(second, "completed")
    done = wait_state(waiter, "completed", "failed", timeout=20)
    assert done["result"] == {"states": ["completed", "completed"]}, done
    assert [run.get("outcome") for run in done["runs"]] == ["deferred", "completed"]
    woken = ts(done["runs"][1]["startedAt"])
    gap = (woken - ts(last["finishedOn"])).total_seconds()
    print(f"the waiter ran {gap:.3f} s after the last job it waited for ended")
    assert 0 <= gap < 1.0


def test_many_jobs_waiting_for_one_are_all_woken_by_its_end(tmp_path):
    shared, until = held(tmp_path)
    waiters = [
        add("test.await_jobs", {"jobs": [shared], "n": n}, queue="default").job_id for n in range(5)
    ]
    for waiter in waiters:
        wait_for(lambda w=waiter: record(w)["state"] == "waiting-children", timeout=10)
    until.touch()
    for waiter in waiters:
        assert wait_state(waiter, "completed", timeout=10)["result"] == {"states": ["completed"]}


def test_a_job_failing_for_good_or_cancelled_ends_the_wait():
    later = JobOptions(delay=1500)
    failing = add("test.unrecoverable", {}, queue="default", opts=later).job_id
    waiter = add("test.await_jobs", {"jobs": [failing]}, queue="default").job_id
    done = wait_state(waiter, "completed", timeout=20)
    assert done["result"] == {"states": ["failed"]}
    assert [run.get("outcome") for run in done["runs"]] == ["deferred", "completed"]
    # a job cancelled while it waits for its delay
    delayed = add("test.echo", {}, queue="default", opts=JobOptions(delay=600_000)).job_id
    waiter = add("test.await_jobs", {"jobs": [delayed]}, queue="default").job_id
    wait_for(lambda: record(waiter)["state"] == "waiting-children", timeout=10)
    cancel(delayed, None)
    assert wait_state(waiter, "completed", timeout=10)["result"] == {"states": ["cancelled"]}


def test_a_job_whose_awaited_jobs_ended_before_it_deferred_runs_again_at_once():
    ended = add("test.echo", {}, queue="default").job_id
    wait_state(ended, "completed")
    waiter = add(
        "test.await_jobs",
        {"jobs": [ended, unique("no-such-job")], "deferFirst": True},
        queue="default",
    ).job_id
    done = wait_state(waiter, "completed", timeout=20)
    deferred, again = done["runs"]
    assert deferred["outcome"] == "deferred"
    assert (ts(again["startedAt"]) - ts(deferred["finishedAt"])).total_seconds() < 1.0


def test_waiting_for_is_a_list_of_job_ids():
    with pytest.raises(ValueError):
        Defer(1000, waiting_for="job-1")
    with pytest.raises(ValueError):
        Defer(1000, waiting_for=["job-1", ""])
    with pytest.raises(ValueError):
        Defer(1000, waiting_for=[f"j{n}" for n in range(1001)])
    assert Defer(1000, waiting_for=["a", "b"]).waiting_for == ("a", "b")


def test_a_job_woken_by_its_backstop_then_waiting_for_its_children_is_not_held_by_the_first_wait(
    tmp_path,
):
    still_running, until = held(tmp_path)
    try:
        waiter = add("test.await_then_children", {"job": still_running}, queue="default").job_id
        # Then its child's end wakes it, though the job it waited for first still runs
        done = wait_state(waiter, "completed", "failed", timeout=20)
        assert done["result"] == {"runs": 3}, done
        assert record(still_running)["state"] == "active"
    finally:
        until.touch()


def test_a_deferral_tries_again_while_a_job_it_waits_for_is_being_ended():
    awaited = add("test.echo", {}, queue="default", opts=JobOptions(delay=600_000)).job_id
    # Given the awaited job's row locked, as by a transaction recording its end
    locked = threading.Event()
    release = threading.Event()

    def hold_the_row() -> None:
        with transaction() as session:
            session.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": awaited})
            locked.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(10)
        # When a job defers waiting for it, the mark does not wait on the lock
        with transaction() as session, pytest.raises(OperationalError, match="lock"):
            waits.mark(session, [awaited])
        waiter = add("test.await_jobs", {"jobs": [awaited]}, queue="default").job_id
        time.sleep(0.5)
    finally:
        release.set()
        holder.join()
    # Then the deferral went through once the row was free, and the wait holds
    wait_for(lambda: record(waiter)["state"] == "waiting-children", timeout=10)
    cancel(awaited, None)
    assert wait_state(waiter, "completed", timeout=10)["result"] == {"states": ["cancelled"]}
