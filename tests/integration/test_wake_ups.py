"""A wake-up (``wake_if_waiting``: a canvas sent over a recorded job) against row locks (real
Postgres): the canvas it names is written to the record unless a transaction that may change
the job holds its row, and the wake-up never waits for one."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from tasks.jobs import add
from tasks.jobs.calls.celery_task import wake_if_waiting
from tasks.platform.db import engine, transaction
from tests.support import broker_lists

pytestmark = pytest.mark.usefixtures("stack")

CANVAS = {"root_id": "root-of-the-canvas", "parent_id": "parent-of-the-canvas"}


def context_of(job_id: str) -> dict:
    with transaction() as session:
        query = text("SELECT celery_ctx FROM jobs WHERE id = :id")
        return session.execute(query, {"id": job_id}).scalar_one() or {}


def canvas_of(headers: dict) -> dict:
    return {key: headers[key] for key in CANVAS}


def woken_in_a_thread(job_id: str) -> None:
    thread = threading.Thread(target=wake_if_waiting, args=(job_id, CANVAS))
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the wake-up waited for another transaction's row lock"


def test_a_log_line_being_written_does_not_keep_the_canvas_off_the_record(idle_queue):
    # Given a recorded job with no message, and a transaction adding a line to its log
    # (its insert holds the job's row FOR KEY SHARE, as the foreign key asks)
    job_id = add("test.echo", {}, queue=idle_queue, publish_now=False).job_id
    with engine().connect() as logging_line:
        logging_line.execute(
            text("INSERT INTO job_logs (job_id, seq, attempt, message) VALUES (:id, 1, 1, 'x')"),
            {"id": job_id},
        )
        # When a canvas wakes the job meanwhile
        woken_in_a_thread(job_id)
        logging_line.rollback()
    # Then its canvas is on the record (what republishes the job if the message is lost)
    assert CANVAS.items() <= context_of(job_id).items()
    # And the message went out, carrying it too
    assert canvas_of(broker_lists.headers_in(idle_queue)[job_id]) == CANVAS


def test_a_wake_up_does_not_wait_for_a_transaction_changing_the_job(idle_queue):
    # Given a recorded job whose row another transaction holds for update (a claim under way)
    job_id = add("test.echo", {}, queue=idle_queue, publish_now=False).job_id
    with engine().connect() as claiming:
        claiming.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": job_id})
        # When a canvas wakes it, the wake-up does not wait: the message alone carries it
        woken_in_a_thread(job_id)
        claiming.rollback()
    assert canvas_of(broker_lists.headers_in(idle_queue)[job_id]) == CANVAS
    assert not CANVAS.items() <= context_of(job_id).items()
