"""Celery task events (what Flower lists): every job sends them but a periodic system job.

``campaign.monitor`` fires every 10 s; with its events on it made half of
Flower's task list. It is declared ``handler(..., events=False)``: no
``task-sent`` from whoever publishes it, no ``task-received``/``-started``/
``-succeeded`` from the worker, while its record is kept as for any job.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from celery import signals
from sqlalchemy import func, select

from tasks.jobs import BulkJob, add, add_bulk
from tasks.jobs.model.models import JobRecord
from tasks.notifications.jobs import MONITOR, QUEUE
from tasks.platform.config import get_settings, reload_settings
from tasks.platform.db import transaction
from tests.support.events import celery_events
from tests.support.inline import join
from tests.support.stack import wait_for


@pytest.fixture
def task_events(inline_worker) -> Iterator[list[dict]]:
    """Every Celery event on the broker while the test runs (as Flower receives them)."""
    with celery_events() as heard:
        yield heard.events


def test_the_campaign_monitor_sends_no_task_events_while_other_jobs_do(task_events):
    # Given a job of an ordinary type and the campaign monitor, both run to completion
    echo = add("test.echo", {"n": 1}, queue="default").job_id
    monitor = add(MONITOR, {}, queue=QUEUE).job_id
    records = join([echo, monitor])
    assert {records[echo]["state"], records[monitor]["state"]} == {"completed"}
    # Then Flower hears the ordinary job's life, and nothing of the monitor's
    wait_for(lambda: {"task-sent", "task-succeeded"} <= kinds(task_events, echo), timeout=10)
    time.sleep(0.5)  # any late event of the monitor's would be in by now
    assert kinds(task_events, monitor) == set()


def test_a_bulk_add_sends_each_job_s_task_sent_event_and_keeps_the_monitor_out(task_events):
    # Given a bulk add of ordinary jobs with a campaign monitor among them
    jobs = [BulkJob("test.echo", {"n": i}, "default") for i in range(30)]
    added = add_bulk([*jobs, BulkJob(MONITOR, {}, QUEUE)])
    ids = [a.job_id for a in added]
    records = join(ids)
    assert {r["state"] for r in records.values()} == {"completed"}

    # Then Flower hears a task-sent (with the job's name and kwargs) for each ordinary job:
    # the batch's events travel as one ``task.multi`` message that the receiver unpacks
    def heard_all() -> bool:
        return all({"task-sent", "task-succeeded"} <= kinds(task_events, i) for i in ids[:-1])

    wait_for(heard_all, timeout=10)
    sent = {e["uuid"]: e for e in task_events if e["type"] == "task-sent"}
    assert sent[ids[0]]["name"] == "test.echo" and sent[ids[0]]["kwargs"] == "{'n': 0}"
    time.sleep(0.5)
    assert kinds(task_events, ids[-1]) == set()


def test_a_bulk_add_s_messages_never_reach_a_worker_before_their_records(task_events):
    # Given a bulk add large enough that its messages leave in several pipelines (kombu
    # flushes a publish batch every 1,000 commands) while a worker consumes the queue
    added = add_bulk([BulkJob("test.echo", {"i": i}, "default") for i in range(BULK_RACE)])
    ids = [a.job_id for a in added]
    # Then every job completes...
    wait_for(lambda: completed(ids) == BULK_RACE, timeout=120)
    # ...and no delivery found its record missing: one that did is ignored, and its job
    # waits for the reconciler (``KEEL_RECONCILE_INTERVAL_S``) to be published again
    assert [e for e in task_events if e["type"] == "task-ignored" and e["uuid"] in ids] == []


def test_jobs_added_one_by_one_share_their_task_sent_message(inline_worker, monkeypatch):
    # Given a process that holds a job's task-sent a second for others (KEEL_EVENT_FLUSH_S)
    monkeypatch.setenv("KEEL_EVENT_FLUSH_S", "1")
    reload_settings()
    try:
        with celery_events() as heard:
            # When it adds five jobs one by one
            ids = [add("test.echo", {"n": n}, queue="default").job_id for n in range(5)]

            # Then Flower hears each job's task-sent, with its own fields...
            def sent() -> dict[str, dict]:
                return {e["uuid"]: e for e in heard.events if e.get("type") == "task-sent"}

            wait_for(lambda: set(ids) <= set(sent()), timeout=10)
            assert [sent()[i]["kwargs"] for i in ids] == [f"{{'n': {n}}}" for n in range(5)]
            # ...in one or two messages (one per second held), not one message each
            carrying = [m for m in heard.messages if any(e.get("uuid") in ids for e in m)]
            carrying = [m for m in carrying if {e.get("type") for e in m} == {"task-sent"}]
            assert 1 <= len(carrying) <= 2, [len(m) for m in carrying]
    finally:
        monkeypatch.undo()
        reload_settings()


BULK_RACE = 1100  # one pipeline of 1,000 goes out while the rest are built


def completed(ids: list[str]) -> int:
    with transaction() as session:
        query = select(func.count()).select_from(JobRecord)
        query = query.where(JobRecord.id.in_(ids), JobRecord.state == "completed")
        return int(session.execute(query).scalar_one())


def test_celery_s_publish_signals_fire_for_each_job_s_message(inline_worker):
    # Given receivers of Celery's before/after_task_publish (tracing, header stamping)
    seen: list[tuple[str, str, str]] = []

    def before(sender: str, headers: dict, routing_key: str, **kw: object) -> None:
        seen.append(("before", headers["id"], routing_key))

    def after(sender: str, headers: dict, routing_key: str, **kw: object) -> None:
        seen.append(("after", headers["id"], routing_key))

    signals.before_task_publish.connect(before, weak=False)
    signals.after_task_publish.connect(after, weak=False)
    try:
        # When a job is added, and two more in bulk
        one = add("test.echo", {"n": 1}, queue="default").job_id
        bulk = [
            a.job_id for a in add_bulk([BulkJob("test.echo", {"n": i}, "default") for i in (2, 3)])
        ]
    finally:
        signals.before_task_publish.disconnect(before)
        signals.after_task_publish.disconnect(after)
    # Then each message was announced before and after it went out, with its queue
    for job_id in (one, *bulk):
        assert [s for s in seen if s[1] == job_id] == [
            ("before", job_id, "default"),
            ("after", job_id, "default"),
        ]


WORKER_TASK_EVENTS = {"task-received", "task-started", "task-succeeded"}


def test_a_worker_s_task_events_leave_in_batches_and_each_is_heard(inline_worker):
    # Given a receiver that notes how many events each broker message carried
    with celery_events() as heard:
        # When a burst of jobs runs on the worker
        added = add_bulk([BulkJob("test.echo", {"n": i}, "default") for i in range(BURST)])
        ids = [a.job_id for a in added]
        assert {r["state"] for r in join(ids).values()} == {"completed"}

        # Then Flower hears each job received, started and succeeded...
        def worker_events() -> list[list[dict]]:
            return [
                [e for e in batch if e["type"] in WORKER_TASK_EVENTS and e["uuid"] in ids]
                for batch in list(heard.messages)
            ]

        def heard_all() -> bool:
            seen = {(e["uuid"], e["type"]) for batch in worker_events() for e in batch}
            return len(seen) == BURST * len(WORKER_TASK_EVENTS)

        wait_for(heard_all, timeout=10)
    # ...in batches: the worker flushes its buffer every KEEL_EVENT_FLUSH_S (or when Celery's
    # buffer of 24 fills), not on every turn of its loop (a PUBLISH and a wait per event:
    # 37 messages for this burst). The timer scheduled before a full buffer's flush still
    # fires, with what came since (so each full flush may bring one small one), and a
    # loaded host delays timers: up to twice the flushes the span and the fills allow.
    carrying = [batch for batch in worker_events() if batch]
    stamps = [e["timestamp"] for batch in carrying for e in batch]
    span = max(stamps) - min(stamps)
    most = 2 * (int(span / get_settings().event_flush_s) + 2 + len(stamps) // 24)
    assert len(carrying) <= most, (span, [len(b) for b in carrying])


BURST = 30


def kinds(events: list[dict], task_id: str) -> set[str]:
    return {e["type"] for e in events if e.get("uuid") == task_id}


def test_flower_hears_a_celery_calls_own_args_and_kwargs(task_events):
    # Given a Celery-style task sent as a Celery call (its data is {"args", "kwargs"})
    from tests.support.jobs import celery_add

    job_id = celery_add.delay(2, y=3).id
    assert join([job_id])[job_id]["result"] == 5
    # Then its task-sent and task-received show the call as made, not the stored shape
    wait_for(lambda: {"task-sent", "task-received"} <= kinds(task_events, job_id), timeout=10)
    for event in task_events:
        if event.get("uuid") == job_id and event["type"] in ("task-sent", "task-received"):
            assert (event["args"], event["kwargs"]) == ("(2,)", "{'y': 3}"), event
