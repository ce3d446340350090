"""A chord's failure policy (the body's ``on_child_failure``): a part that fails for good
fails the body (``fail``), counts as an error value (``ignore``) or is left out
(``remove``); the body runs once either way. BullMQ's ``failParentOnFailure``,
``ignoreDependencyOnFailure`` and ``removeDependencyOnFailure``."""

from __future__ import annotations

import pytest
from celery import chord

from tasks.jobs.end.cancel import cancel
from tests.support.client import wait_state
from tests.support.jobs import celery_add, celery_autoretry_all, celery_collect

pytestmark = pytest.mark.usefixtures("inline_worker")
REASON = "this input can never succeed"


def chord_of_ten(policy: str | None):
    """8 parts adding (n + n) and 2 failing for good, at places 3 and 7."""
    parts = [celery_autoretry_all.si() if n in (3, 7) else celery_add.si(n, n) for n in range(10)]
    body = celery_collect.s()
    if policy is not None:
        body = body.set(on_child_failure=policy)
    return chord(parts)(body)


def test_fail_the_default_fails_the_body_without_running_it():
    for policy in (None, "fail"):
        body = wait_state(chord_of_ten(policy).id, "completed", "failed", timeout=20)
        assert body["state"] == "failed", body
        assert body["failedReason"].endswith(f"failed: {REASON}"), body
        assert body["attemptsStarted"] == 0 and body["result"] is None


def test_ignore_runs_the_body_once_with_ten_entries_two_of_them_errors():
    result = chord_of_ten("ignore")
    body = wait_state(result.id, "completed", "failed", timeout=20)
    assert (body["state"], body["attemptsStarted"]) == ("completed", 1), body
    results = body["result"]["results"]
    assert len(results) == 10
    errors = [entry for entry in results if isinstance(entry, dict)]
    assert [results.index(error) for error in errors] == [3, 7]
    assert all(error["error"] == REASON and error["jobId"] for error in errors)
    assert body["result"]["total"] == sum(n + n for n in range(10) if n not in (3, 7))


def test_remove_runs_the_body_once_with_the_eight_results():
    body = wait_state(chord_of_ten("remove").id, "completed", "failed", timeout=20)
    assert (body["state"], body["attemptsStarted"]) == ("completed", 1), body
    assert body["result"]["results"] == [n + n for n in range(10) if n not in (3, 7)]


def test_the_chords_get_returns_the_bodys_result_when_the_body_goes_on_past_failed_parts():
    for policy in ("ignore", "remove"):
        # Waited on as it runs: Celery's check of the parts is made while it waits too
        result = chord_of_ten(policy)
        got = result.get(timeout=20)
        assert got == wait_state(result.id, "completed")["result"], policy
        assert len(got["results"]) == (10 if policy == "ignore" else 8)
        # and once it ended, when the failed parts are there to see from the start
        ended = chord_of_ten(policy)
        body = wait_state(ended.id, "completed", "failed", timeout=20)
        assert body["state"] == "completed", body
        assert ended.get(timeout=10) == body["result"], policy


def test_the_chords_get_raises_the_failed_parts_error_when_the_body_fails_as_in_celery():
    result = chord_of_ten("fail")
    wait_state(result.id, "failed", timeout=20)
    with pytest.raises(Exception, match=REASON) as raised:
        result.get(timeout=10)
    assert type(raised.value).__name__ == "UnrecoverableError"  # the part's, by follow_parents


def test_a_cancelled_part_follows_the_policy_too():
    # When a chord's part is cancelled before it runs (its queue has no worker)
    parts = [celery_add.si(1, 1), celery_add.si(2, 2).set(queue="nobody-consumes-this")]
    result = chord(parts)(celery_collect.s().set(on_child_failure="remove"))
    cancel(result.parent.results[1].id, None)
    # Then the body runs with the other part's result
    body = wait_state(result.id, "completed", "failed", timeout=20)
    assert body["result"]["results"] == [2], body


def test_an_unknown_policy_is_refused_by_the_call():
    with pytest.raises(ValueError, match="on_child_failure must be one of fail, ignore, remove"):
        chord([celery_add.si(1, 1)])(celery_collect.s().set(on_child_failure="skip"))
