"""``AsyncResult`` over the job records: Celery's result API answered by Keel's backend.

A real ``celery worker`` runs the jobs; this process calls them the Celery way and waits
with ``.get()``, as a project that already uses Celery does.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from celery import chain, chord, group
from celery.exceptions import TimeoutError as ResultTimeout
from celery.result import AsyncResult
from sqlalchemy import event, text

from tasks.celery import app
from tasks.jobs import Owner, acting_as
from tasks.jobs.calls.result_backend import FALLBACK_POLL_S
from tasks.jobs.observe.events import result_channel
from tasks.jobs.observe.queries import describe_full, get
from tasks.platform import db
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.client import wait_state
from tests.support.jobs import (
    FlakyIO,
    PlainFailure,
    always_fails,
    celery_add,
    celery_autoretry,
    celery_collect,
    celery_headers,
    celery_retry,
)
from tests.support.stack import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.usefixtures("worker")]


def test_a_result_is_the_handlers_return_value():
    result = celery_add.delay(2, 3)
    assert result.get(timeout=20) == 5
    assert result.state == "SUCCESS"
    assert result.successful() and result.ready() and not result.failed()
    assert result.date_done is not None
    assert result.retries == 0
    # A fresh handle reads the record too (no cache of this process's)
    fresh = AsyncResult(result.id, app=app)
    assert (fresh.state, fresh.result) == ("SUCCESS", 5)


def test_a_failure_raises_the_handlers_exception_with_its_traceback():
    result = always_fails.delay()
    with pytest.raises(PlainFailure, match="plain failure on run 1"):
        result.get(timeout=20)
    assert result.state == "FAILURE" and result.failed()
    returned = AsyncResult(result.id, app=app).get(timeout=5, propagate=False)
    assert isinstance(returned, PlainFailure)
    assert "in always_fails" in result.traceback  # the handler's own frame
    assert "PlainFailure: plain failure on run 1" in result.traceback


def test_a_job_waiting_out_a_retry_reads_retry_then_success():
    result = celery_autoretry.delay(1)  # fails once with FlakyIO, retried after ~1 s
    assert wait_state(result.id, "delayed", timeout=20)["attemptsMade"] == 1
    retrying = AsyncResult(result.id, app=app)
    assert retrying.state == "RETRY"
    assert isinstance(retrying.result, FlakyIO)  # the error it waits out, as in Celery
    assert result.get(timeout=20) == {"retries": 1}
    assert AsyncResult(result.id, app=app).retries == 1


def test_retries_counts_retries_not_runs_as_celery_does():
    # Given a task failing on every run, max_retries=3: four runs (waits of 1, 2 and 4 s)
    result = celery_autoretry.delay(9)
    seen: set[tuple[str, int]] = set()

    def ended() -> bool:
        meta = app.backend.get_task_meta(result.id)  # one read: its state and retries together
        seen.add((meta["status"], meta["retries"]))
        return meta["status"] == "FAILURE"

    wait_for(ended, timeout=40, interval=0.05)
    job = wait_state(result.id, "failed")
    # Each run saw request.retries 0, 1, 2, 3 (its error says retries + 1) …
    assert [run["error"] for run in job["runs"]] == [f"flaky run {n}" for n in (1, 2, 3, 4)]
    assert (job["attemptsMade"], job["attemptsStarted"]) == (4, 4)  # Keel's counters: runs
    # … and the result says 3 at the end, as Celery's does after the last retry
    assert AsyncResult(result.id, app=app).retries == 3
    # Waiting out each retry, it read RETRY with the failed run's retries, as Celery stores it
    assert {("RETRY", 0), ("RETRY", 1), ("RETRY", 2)} <= seen, seen
    assert all(retries <= 3 for _, retries in seen) and ("RETRY", 3) not in seen, seen


def test_a_revoked_job_reads_revoked():
    result = celery_add.apply_async((1, 2), countdown=120)
    assert AsyncResult(result.id, app=app).state == "PENDING"
    result.revoke()
    wait_state(result.id, "cancelled", timeout=20)
    assert AsyncResult(result.id, app=app).state == "REVOKED"


def test_group_chord_and_chain_results_come_back_in_order():
    assert group(celery_add.s(i, i) for i in range(6))().get(timeout=30) == [0, 2, 4, 6, 8, 10]
    assert chain(celery_add.s(1, 2), celery_add.s(3), celery_add.s(4))().get(timeout=30) == 10
    body = chord([celery_add.s(i, 1) for i in range(4)], celery_collect.s())()
    assert body.get(timeout=30) == {"results": [1, 2, 3, 4], "total": 10}


def test_another_tenants_job_reads_pending_with_nothing_of_its_data():
    with acting_as(Owner("results-a", "ann")):
        result = celery_add.delay(40, 2)
        assert result.get(timeout=20) == 42
    with acting_as(Owner("results-b", "bob")):
        other = AsyncResult(result.id, app=app)
        assert (other.state, other.result, other.traceback) == ("PENDING", None, None)
        with pytest.raises(ResultTimeout):
            AsyncResult(result.id, app=app).get(timeout=1)
    assert AsyncResult(result.id, app=app).result == 42  # a system process reads every job


def test_a_plain_celery_tasks_result_is_celerys_own():
    # beat_tick is base=celery.Task: no record; its result is stored by Celery in Redis
    from tests.support.jobs import beat_tick

    result = beat_tick.delay()
    assert wait_for(lambda: result.ready() or None, timeout=20)
    assert result.state == "SUCCESS"


def test_forget_drops_the_result_and_keeps_the_record():
    result = celery_add.delay(7, 7)
    assert result.get(timeout=20) == 14
    result.forget()
    again = AsyncResult(result.id, app=app)
    assert again.state == "SUCCESS" and again.result is None
    assert wait_state(result.id, "completed")["result"] is None


def test_a_wait_whose_news_was_lost_ends_by_reading_the_record_again():
    # Given a job that will never run here, and a caller waiting on it
    result = celery_add.apply_async((1, 1), countdown=600)
    answers: list = []
    waiter = threading.Thread(target=lambda: answers.append(result.get(timeout=30)))
    waiter.start()
    subscribed = lambda: redis_client().pubsub_numsub(result_channel(result.id))[0][1] or None  # noqa: E731
    wait_for(subscribed, timeout=10)
    time.sleep(0.5)  # past its first read of the record, which found it delayed
    # When its record ends without the news a worker publishes (a worker that committed
    # and died before its publish, or a Redis that restarted in between)
    with transaction() as session:
        session.execute(
            text(
                "UPDATE jobs SET state = 'completed', result = '99', finished_on = now(), "
                "run_at = NULL WHERE id = :id"
            ),
            {"id": result.id},
        )
    # Then the waiting caller reads the record again within its fallback interval
    waiter.join(timeout=FALLBACK_POLL_S * 3)
    assert answers == [99]


def test_a_calls_headers_reach_every_run_and_stay_on_the_record():
    headers = {"correlation_id": "req-42", "trace_hint": {"span": 7}}
    result = celery_headers.apply_async(kwargs={"fail_first": True}, headers=headers)
    assert result.get(timeout=20) == {
        "headers": headers,  # correlation_id too: Celery's request keeps only its own
        "trace_hint": {"span": 7},  # a name Celery's request does not use: an attribute too
        "retries": 1,  # the retry's run saw them too
    }
    with transaction() as session:
        ctx = session.execute(
            text("SELECT celery_ctx FROM jobs WHERE id = :id"), {"id": result.id}
        ).scalar_one()
    assert ctx["headers"] == headers
    # Celery's own headers are not a call's to set
    with pytest.raises(ValueError, match="'task' is Celery's own"):
        celery_add.apply_async((1, 2), headers={"task": "something.else"})


def test_a_job_completed_after_a_retry_keeps_its_failure_in_the_run_alone():
    result = celery_autoretry.delay(1)
    assert result.get(timeout=20) == {"retries": 1}
    done = wait_state(result.id, "completed")
    assert done["failedReason"] is None
    first, second = done["runs"]
    assert (first["outcome"], first["error"]) == ("retrying", "flaky run 1")
    assert first["exception"] == {"exc_type": "FlakyIO", "exc_module": "tests.support.jobs"}
    assert second["outcome"] == "completed"


def test_two_hundred_callers_waiting_at_once_cost_postgres_a_few_reads_each():
    # Given 200 jobs due in 2 s, each waited on by a thread of its own meanwhile
    results = [celery_add.apply_async((n, n), countdown=2) for n in range(200)]
    statements: list[str] = []
    engine = db.engine()

    def count(conn, cursor, statement, parameters, context, executemany):
        if "FROM jobs WHERE id = ANY" in statement:
            statements.append(threading.current_thread().name)

    event.listen(engine, "before_cursor_execute", count)
    try:
        answers: dict[int, int] = {}

        def wait(n: int) -> None:
            answers[n] = AsyncResult(results[n].id, app=app).get(timeout=60)

        threads = [threading.Thread(target=wait, args=(n,)) for n in range(200)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    # Then every result is right, and each caller read its record a few times at most (its
    # first look, the news of its job's end, a fallback round), never in a polling loop
    assert answers == {n: 2 * n for n in range(200)}
    per_caller = Counter(statements)
    assert max(per_caller.values()) <= 4, per_caller.most_common(3)
    print(f"200 waiting callers: {len(statements)} reads of the jobs table")


def test_an_expired_result_reads_pending_once_a_workers_sweep_took_it():
    result = celery_add.delay(20, 22)
    assert result.get(timeout=20) == 42
    # When it ended longer ago than Celery's result_expires (1 day: the default retention)
    with transaction() as session:
        session.execute(
            text("UPDATE jobs SET finished_on = now() - interval '25 hours' WHERE id = :id"),
            {"id": result.id},
        )
    # Then a worker's maintenance sweeps it (every KEEL_RETENTION_INTERVAL_S, 1 s here), and
    # its result reads as an expired Celery result does
    wait_for(lambda: AsyncResult(result.id, app=app).state == "PENDING", timeout=30)
    with transaction() as session:
        assert (
            session.scalar(text("SELECT count(*) FROM jobs WHERE id = :id"), {"id": result.id}) == 0
        )


def test_the_record_shows_the_tasks_max_retries_and_a_call_can_set_its_own():
    # A task declared with max_retries=2: its record says so, and it may retry twice
    kept = celery_retry.delay(2, "kept")
    assert kept.get(timeout=20) == {"retries": 2, "label": "kept"}
    assert describe_full(get(kept.id))["opts"]["maxRetries"] == 2
    # The same task called with maxRetries 0 fails at its first retry, with the run's error
    once = celery_retry.apply_async((1, "once"), job_options={"maxRetries": 0})
    with pytest.raises(PlainFailure, match="run 1"):
        once.get(timeout=20)
    done = describe_full(get(once.id))
    assert (done["state"], done["attemptsMade"], done["opts"]["maxRetries"]) == ("failed", 1, 0)


def _watched(job_id: str) -> bool | None:
    with transaction() as session:
        return session.execute(
            text("SELECT watched FROM jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()


def test_a_success_is_told_on_its_channel_only_when_a_caller_waits_on_it():
    # Given two jobs due in a second, a raw listener on both result channels, and a caller
    # waiting on the second only
    alone = celery_add.apply_async((1, 1), countdown=1)
    waited = celery_add.apply_async((2, 2), countdown=1)
    listener = redis_client().pubsub(ignore_subscribe_messages=True)
    listener.subscribe(result_channel(alone.id), result_channel(waited.id))
    answers: list[tuple[int, float]] = []

    def wait() -> None:
        started = time.monotonic()
        value = AsyncResult(waited.id, app=app).get(timeout=30)
        answers.append((value, time.monotonic() - started))

    waiter = threading.Thread(target=wait)
    waiter.start()
    # When both complete
    wait_state(alone.id, "completed")
    wait_state(waited.id, "completed")
    waiter.join(timeout=30)
    told: list[str] = []
    deadline = time.monotonic() + 1.0  # the news follows the commit by a round trip
    while time.monotonic() < deadline:
        message = listener.get_message(timeout=0.1)
        if message is not None:
            told.append(message["channel"].decode())
    listener.close()
    # Then only the waited job's end was told, and its caller heard it rather than waiting
    # for its fallback read (due FALLBACK_POLL_S after it began to wait)
    assert told == [result_channel(waited.id)]
    assert (_watched(alone.id), _watched(waited.id)) == (None, True)
    [(value, waited_s)] = answers
    assert value == 4
    assert waited_s < FALLBACK_POLL_S - 1, waited_s


def test_a_group_wait_marks_every_part_and_hears_each_end():
    parts = group(celery_add.s(n, n) for n in range(4)).apply_async(countdown=1)
    started = time.monotonic()
    assert parts.get(timeout=30) == [0, 2, 4, 6]
    assert time.monotonic() - started < FALLBACK_POLL_S - 1
    assert [_watched(part.id) for part in parts.results] == [True] * 4


def test_a_wait_on_another_tenants_job_marks_nothing():
    theirs = celery_add.apply_async((3, 3), countdown=600)
    with acting_as(Owner("someone-else", "them")), pytest.raises(ResultTimeout):
        AsyncResult(theirs.id, app=app).get(timeout=1)
    assert _watched(theirs.id) is None
