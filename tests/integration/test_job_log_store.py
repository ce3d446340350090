"""A job's log against Postgres, no worker (``tasks.jobs.run.job_log``): threads of one
handler logging at once, lines Postgres text cannot hold, secrets, a deleted job."""

from __future__ import annotations

import os
import threading

import pytest
from sqlalchemy import text

from tasks.jobs.intake.enqueue import add
from tasks.jobs.model.options import JobOptions
from tasks.jobs.run import job_log
from tasks.platform.db import transaction
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def recorded_job() -> str:
    return add("test.echo", {"n": unique()}, queue="default", opts=JobOptions(delay=600_000)).job_id


def stored(job_id: str) -> list[tuple[int, str]]:
    with transaction() as session:
        rows = session.execute(
            text("SELECT seq, message FROM job_logs WHERE job_id = :id ORDER BY seq"),
            {"id": job_id},
        ).all()
    return [(r.seq, r.message) for r in rows]


def test_threads_logging_at_once_lose_no_line_and_share_no_number():
    job_id = recorded_job()
    numbers: list[int | None] = []
    lock = threading.Lock()

    def log_many(thread: int) -> None:
        for n in range(40):
            seq = job_log.write(job_id, 1, f"thread {thread} line {n}")
            with lock:
                numbers.append(seq)

    threads = [threading.Thread(target=log_many, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(numbers) == list(range(1, 321))  # type: ignore[type-var]
    lines = stored(job_id)
    assert [seq for seq, _ in lines] == list(range(1, 321))
    assert len({message for _, message in lines}) == 320


def test_a_line_postgres_text_cannot_hold_is_stored_readably():
    job_id = recorded_job()
    undecodable = os.fsdecode(b"report-\xff.csv")  # a lone surrogate
    assert job_log.write(job_id, 1, f"reading {undecodable}") == 1
    assert job_log.write(job_id, 1, "a\x00b") == 2
    assert stored(job_id) == [(1, "reading report-\\udcff.csv"), (2, "a\ufffdb")]


def test_a_token_in_a_line_is_masked_as_in_every_log():
    job_id = recorded_job()
    job_log.write(job_id, 1, "calling with Authorization: Bearer abc.def-123")
    [(_, line)] = stored(job_id)
    assert "abc.def-123" not in line and "Bearer ***" in line


def test_a_deleted_jobs_run_logs_nothing_and_goes_on():
    job_id = recorded_job()
    with transaction() as session:
        session.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job_id})
    assert job_log.write(job_id, 1, "after the record went") is None
    assert stored(job_id) == []
