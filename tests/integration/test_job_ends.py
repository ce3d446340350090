"""Every way a job ends without a result fails the chord body that counts on it.

A job ends failed or cancelled along several paths: a run failing for good,
a cancel or revoke, too many stalls, a message no worker can run, and a
message that arrives without a record with arguments its handler cannot
take. Each must do what an end does (free the dedup claim, trim by
retention, fail a chord's body, announce it). These tests take the paths a
unit test cannot reach with a real worker (``inline_worker``) and the
module's Postgres.
"""

from __future__ import annotations

import pytest
from celery import Celery

from tasks.jobs.end import canvas
from tasks.platform.config import get_settings
from tests.support.client import record, unique, wait_state
from tests.support.jobs import celery_collect

pytestmark = pytest.mark.usefixtures("inline_worker")


def chord_waiting_for(part_id: str) -> str:
    """A Keel chord body recorded as ``waiting-children``, counting on one part; its id."""
    body = celery_collect.s().set(task_id=unique("body"))
    assert canvas.open_chord(celery_collect, body, [part_id])
    return str(body.options["task_id"])


def other_app() -> Celery:
    """Another project's Celery app on the same broker: it knows no Keel, sends by name."""
    return Celery("other", broker=get_settings().redis_url, set_as_current=False)


def test_a_part_that_arrives_without_a_record_and_is_refused_fails_its_chords_body():
    # Given a chord body counting on one part
    part = unique("part")
    body = chord_waiting_for(part)
    # When that part arrives by name from another app, without a record, with positional
    # arguments its handler (test.echo: data as a dict) cannot take
    other = other_app()
    try:
        other.send_task(
            "test.echo",
            args=(1, 2),
            task_id=part,
            queue="default",
            chord=celery_collect.s().set(task_id=body),
        )
    finally:
        other.close()
    # Then the part is recorded on arrival and fails saying why
    failed = wait_state(part, "failed", timeout=20)
    assert "positional" in failed["failedReason"] or "argument" in failed["failedReason"], failed
    # and the body fails with it instead of waiting for a result that never comes
    ended = wait_state(body, "failed", timeout=20)
    assert part in ended["failedReason"], ended


def test_a_part_no_worker_can_run_fails_its_chords_body():
    # Given a chord body counting on one part, sent by name for a task no worker has
    part = unique("part")
    body = chord_waiting_for(part)
    other = other_app()
    try:
        other.send_task(
            "nobody.has.this",
            task_id=part,
            queue="default",
            chord=celery_collect.s().set(task_id=body),
        )
    finally:
        other.close()
    # Then the body fails with the unsupported part
    ended = wait_state(body, "failed", timeout=20)
    assert part in ended["failedReason"], ended
    assert record(part)["state"] == "failed"  # recorded on arrival, as it came


def test_a_failed_body_that_is_itself_a_part_fails_the_outer_chords_body():
    # Given an outer chord whose part is an inner chord's body, the inner one counting on
    # one part
    inner_body, part = unique("inner"), unique("part")
    outer = celery_collect.s().set(task_id=unique("outer"))
    assert canvas.open_chord(celery_collect, outer, [inner_body])
    inner = celery_collect.s().set(task_id=inner_body, chord=outer)
    assert canvas.open_chord(celery_collect, inner, [part])
    # When the inner part arrives without a record and is refused
    other = other_app()
    try:
        other.send_task("test.echo", args=(1, 2), task_id=part, queue="default", chord=inner)
    finally:
        other.close()
    # Then the inner body fails, and with it the outer body (it waited for ever before)
    assert part in wait_state(inner_body, "failed", timeout=20)["failedReason"]
    outer_body = str(outer.options["task_id"])
    assert inner_body in wait_state(outer_body, "failed", timeout=20)["failedReason"]
