"""A run's end that Postgres rolls back (a deadlock's victim) is written again, not left
for the lock to run out (real Postgres; a queue no worker consumes, claimed here as a
worker would claim it)."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tasks.jobs.end import finish
from tasks.jobs.model.options import Deduplication
from tasks.platform.db import transaction
from tests.support.client import claimed_job, unique
from tests.support.databases import jobs_failing_once

pytestmark = pytest.mark.usefixtures("stack")


def record(job_id: str) -> dict:
    with transaction() as session:
        row = session.execute(
            text("SELECT state, result, attempts_made, lock_token FROM jobs WHERE id = :id"),
            {"id": job_id},
        )
        return dict(row.mappings().one())


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
@pytest.mark.parametrize(
    "opts",
    [{}, {"deduplication": Deduplication(id="d")}],
    ids=["statement alone", "in a transaction"],
)
def test_a_completion_rolled_back_is_written_again(sqlstate, opts):
    if opts:  # a deduplication id of its own: the release of its claim joins the end's write
        opts = {"deduplication": Deduplication(id=unique("dedup"))}
    claimed = claimed_job(**opts)
    with jobs_failing_once(claimed.id, sqlstate, on="UPDATE"):
        finish.completed(claimed, {"answer": 42})
    found = record(claimed.id)
    assert found["state"] == "completed" and found["result"] == {"answer": 42}
    assert found["lock_token"] is None


def test_a_write_rolled_back_every_time_is_tried_three_times_in_all():
    twice, thrice = claimed_job(), claimed_job()
    with jobs_failing_once(twice.id, "40P01", on="UPDATE", times=2):
        finish.completed(twice, "ok")
    with (
        jobs_failing_once(thrice.id, "40P01", on="UPDATE", times=3),
        pytest.raises(OperationalError),
    ):
        finish.completed(thrice, "ok")
    assert (record(twice.id)["state"], record(thrice.id)["state"]) == ("completed", "active")


@pytest.mark.parametrize("in_transaction", [False, True], ids=["statement alone", "transaction"])
def test_a_failure_rolled_back_is_written_again(in_transaction):
    def opts() -> dict:
        return {"deduplication": Deduplication(id=unique("dedup"))} if in_transaction else {}

    final, again = claimed_job(**opts()), claimed_job(attempts=2, **opts())
    with jobs_failing_once(final.id, "40P01", on="UPDATE"):
        assert finish.failed(final, ValueError("boom")) is None
    with jobs_failing_once(again.id, "40P01", on="UPDATE"):
        assert finish.failed(again, ValueError("boom")) is not None
    assert record(final.id)["state"] == "failed"
    assert (record(again.id)["state"], record(again.id)["attempts_made"]) == ("delayed", 1)


def test_an_error_that_may_have_committed_is_not_written_again():
    """A timeout is not a rollback the client was told of: the run stays active, its lock
    runs out and another run records the job (at least once), as before."""
    claimed = claimed_job()
    with jobs_failing_once(claimed.id, "57014", on="UPDATE"), pytest.raises(OperationalError):
        finish.completed(claimed, {"answer": 42})
    assert record(claimed.id)["state"] == "active"
