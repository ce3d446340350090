"""Held jobs against Postgres (``tasks.jobs.store.pauses``), no worker: a hold that races
the transaction making its job waiting, the release of one lifted pause's jobs, and a held
job that is deleted."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from tasks.jobs.intake import pauses
from tasks.jobs.intake.enqueue import add
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner
from tasks.jobs.store import pauses as store
from tasks.platform.db import engine, transaction
from tests.support.client import unique
from tests.support.stack import wait_for

pytestmark = pytest.mark.usefixtures("stack")
QUEUE = "pausable"


def delayed_job(tenant: str | None = None) -> str:
    """A job recorded delayed (no message sent), owned by ``tenant``."""
    owner = Owner(tenant_id=tenant, user_id="u") if tenant else None
    added = add(
        "test.pausable",
        {"n": unique()},
        queue=QUEUE,
        opts=JobOptions(delay=600_000),
        owner=owner,
        publish_now=False,
    )
    return added.job_id


def make_waiting(job_ids: list[str]) -> None:
    with transaction() as session:
        session.execute(
            text("UPDATE jobs SET state = 'waiting', run_at = NULL WHERE id = ANY(:ids)"),
            {"ids": job_ids},
        )


def hold_now(job_id: str) -> store.Hold:
    with transaction() as session:
        return store.hold(session, job_id)


def test_a_hold_waits_for_the_transaction_that_makes_its_job_waiting():
    queue_pause = pauses.pause(QUEUE, by="test")
    assert queue_pause
    try:
        job_id = delayed_job()
        # Given a promotion of the delayed job that has not committed yet (its message
        # may already be out: a promoter publishes before its commit)
        promoter = engine().connect()
        promoter.execute(
            text("UPDATE jobs SET state = 'waiting', run_at = NULL WHERE id = :id"),
            {"id": job_id},
        )
        # When the worker that took the message holds it meanwhile
        answer: list[store.Hold] = []
        holder = threading.Thread(target=lambda: answer.append(hold_now(job_id)))
        holder.start()
        wait_for(lambda: waiting_on_a_lock() or None, timeout=10)
        assert answer == []  # it waits for the promotion's commit, not its own snapshot
        promoter.commit()
        promoter.close()
        holder.join(timeout=10)
        # Then the job is held, not left to a claim that would run it
        assert answer == [store.Hold.HELD]
        with transaction() as session:
            assert store.held_ids(session, [job_id]) == [job_id]
    finally:
        pauses.resume(QUEUE, by="test")


def test_a_delivery_that_outruns_its_records_insert_waits_for_it_then_is_held():
    assert pauses.pause(QUEUE, by="test")
    try:
        job_id = f"chain-step-{unique()}"
        # Given a chain step's record inserted in a transaction still open (its parent's
        # completion publishes it before the commit)
        parent = engine().connect()
        parent.execute(
            text(
                "INSERT INTO jobs (id, name, queue, data, opts, state) VALUES "
                "(:id, 'test.pausable', :queue, '{}', '{}', 'waiting')"
            ),
            {"id": job_id, "queue": QUEUE},
        )
        # When its delivery is looked at on the paused queue meanwhile
        answer: list[store.Hold] = []
        holder = threading.Thread(target=lambda: answer.append(pauses.hold_delivery(job_id)))
        holder.start()
        wait_for(lambda: waiting_on_a_lock("INSERT") or None, timeout=10)
        assert answer == []
        parent.commit()
        parent.close()
        holder.join(timeout=10)
        # Then it waited for the insert and held the job, not left it to the claim
        assert answer == [store.Hold.HELD]
    finally:
        pauses.resume(QUEUE, by="test")


def test_an_active_job_whose_worker_died_is_left_to_the_stalled_check_while_paused():
    assert pauses.pause(QUEUE, by="test")
    try:
        expired, live = delayed_job(), delayed_job()
        with transaction() as session:
            for job_id, lock in ((expired, "-10 seconds"), (live, "30 seconds")):
                session.execute(
                    text(
                        "UPDATE jobs SET state = 'active', "
                        "locked_until = clock_timestamp() + CAST(:lock AS interval) WHERE id = :id"
                    ),
                    {"id": job_id, "lock": lock},
                )
        # A redelivery of the dead run's job is not claimed (that would start it again)
        assert hold_now(expired) is store.Hold.LEAVE
        # A duplicate delivery of a running job goes on to the claim, which refuses it
        assert hold_now(live) is store.Hold.RUN
    finally:
        pauses.resume(QUEUE, by="test")


def waiting_on_a_lock(statement: str = "FOR SHARE") -> bool:
    with transaction() as session:
        return bool(
            session.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE :like AND datname = current_database()"
                ),
                {"like": f"%{statement}%"},
            ).scalar_one()
        )


def test_a_job_that_is_not_waiting_is_not_held():
    assert pauses.pause(QUEUE, by="test")
    try:
        job_id = delayed_job()
        assert hold_now(job_id) is store.Hold.RUN  # delayed: the claim refuses it
        assert hold_now(f"nosuch-{unique()}") is store.Hold.NO_RECORD
    finally:
        pauses.resume(QUEUE, by="test")


def test_a_resume_releases_only_what_its_own_pause_held():
    acme, globex = unique("acme"), unique("globex")
    assert pauses.pause(QUEUE, acme, by="ops") and pauses.pause(QUEUE, globex, by="ops")
    acme_jobs = [delayed_job(acme) for _ in range(3)]
    globex_jobs = [delayed_job(globex) for _ in range(2)]
    make_waiting(acme_jobs + globex_jobs)
    assert all(hold_now(j) is store.Hold.HELD for j in acme_jobs + globex_jobs)
    # Given globex's pause lifted in the database, its held jobs not yet released (what a
    # process that died in its resume leaves, for maintenance to release)
    with transaction() as session:
        assert store.lift(session, QUEUE, globex)
    # When acme's operator resumes
    resumed = pauses.resume(QUEUE, acme, by="ops")
    # Then acme's three are published, and globex's are left to maintenance
    assert (resumed.lifted, resumed.released) == (True, 3)
    with transaction() as session:
        assert sorted(store.held_ids(session, acme_jobs + globex_jobs)) == sorted(globex_jobs)
    assert pauses.release_unpaused() == 2


def test_a_held_job_deleted_is_no_longer_held():
    assert pauses.pause(QUEUE, by="test")
    try:
        kept, deleted = delayed_job(), delayed_job()
        make_waiting([kept, deleted])
        assert hold_now(kept) is hold_now(deleted) is store.Hold.HELD
        before = pauses.held().get(QUEUE, 0)
        with transaction() as session:
            session.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": deleted})
            assert store.held_ids(session, [kept, deleted]) == [kept]
        # A cancelled held job is not counted as held either
        with transaction() as session:
            session.execute(
                text("UPDATE jobs SET state = 'cancelled' WHERE id = :id"), {"id": kept}
            )
        assert pauses.held().get(QUEUE, 0) == before - 2
    finally:
        pauses.resume(QUEUE, by="test")
