"""A chain's failure policy (the next step's ``on_child_failure``): a step that fails for
good stops the chain (``fail``, Celery's way), or the next step runs with the failure as
its first argument (``ignore``) or without the failed step's result (``remove``), and the
chain goes on from there. The chord's: ``test_chord_failure_policies.py``."""

from __future__ import annotations

import pytest
from celery import chain

from tasks.jobs import JobOptions, add
from tasks.jobs.end.cancel import cancel
from tasks.jobs.observe.queries import get
from tests.support.client import wait_state
from tests.support.jobs import celery_add, celery_autoretry_all, celery_got

pytestmark = pytest.mark.usefixtures("inline_worker")
REASON = "this input can never succeed"


def three_steps(policy: str | None):
    """add(1, 1) → a step failing for good → got("x"), its policy ``policy``; then got()."""
    after = celery_got.s("x")
    if policy is not None:
        after = after.set(on_child_failure=policy)
    return chain(celery_add.si(1, 1), celery_autoretry_all.si(), after, celery_got.s())()


def step_ids(result) -> list[str]:
    ids = []
    while result is not None:
        ids.append(result.id)
        result = result.parent
    return list(reversed(ids))


def test_fail_the_default_stops_the_chain_at_the_failed_step():
    for policy in (None, "fail"):
        first, failing, after, last = step_ids(three_steps(policy))
        assert wait_state(failing, "completed", "failed", timeout=20)["state"] == "failed"
        assert wait_state(first, "completed")["result"] == 2
        assert get(after) is None and get(last) is None  # never recorded


def test_ignore_passes_the_failure_to_the_next_step_and_the_chain_goes_on():
    _, failing, after, last = step_ids(three_steps("ignore"))
    got = wait_state(after, "completed", "failed", timeout=20)
    assert got["state"] == "completed", got
    assert got["result"] == {"args": [{"error": REASON, "jobId": failing}, "x"], "kwargs": {}}
    assert got["attemptsStarted"] == 1
    # and the step after it gets its result, as in any chain
    tail = wait_state(last, "completed", "failed", timeout=20)
    assert tail["result"] == {"args": [got["result"]], "kwargs": {}}


def test_remove_calls_the_next_step_without_the_failed_step_s_result():
    _, failing, after, last = step_ids(three_steps("remove"))
    got = wait_state(after, "completed", "failed", timeout=20)
    assert get(failing).state == "failed"
    assert got["result"] == {"args": ["x"], "kwargs": {}}, got
    assert wait_state(last, "completed", timeout=20)["result"]["args"] == [got["result"]]


def test_the_chains_get_returns_its_end_when_a_step_went_on_past_a_failed_one():
    for policy in ("ignore", "remove"):
        result = three_steps(policy)
        assert result.get(timeout=20) == wait_state(result.id, "completed")["result"], policy


def test_the_chains_get_raises_the_failed_steps_error_when_the_chain_stops_as_in_celery():
    # The chain's last step never runs: the failed step's error ends the wait (follow_parents)
    result = three_steps(None)
    with pytest.raises(Exception, match=REASON) as raised:
        result.get(timeout=20)
    assert type(raised.value).__name__ == "UnrecoverableError"
    # and a step that went on past a failed one is stopped by a later failure as in Celery
    after_failure = chain(
        celery_autoretry_all.si(),
        celery_autoretry_all.si().set(on_child_failure="ignore"),
        celery_got.s(),
    )()
    with pytest.raises(Exception, match=REASON):
        after_failure.get(timeout=20)
    assert get(after_failure.id) is None  # never recorded: the chain stopped before it


def test_a_cancelled_step_follows_the_policy_too():
    # When a step waiting on a queue no worker consumes is cancelled
    result = chain(
        celery_add.si(2, 2).set(queue="nobody-consumes-this"),
        celery_got.s().set(on_child_failure="ignore"),
    )()
    waiting, after = step_ids(result)
    cancel(waiting, None)
    got = wait_state(after, "completed", "failed", timeout=20)
    (error,) = got["result"]["args"]
    assert error["jobId"] == waiting and error["error"]


def test_an_unknown_policy_is_refused_by_the_call():
    with pytest.raises(ValueError, match="on_child_failure"):
        chain(celery_add.si(1, 1), celery_got.s().set(on_child_failure="skip")).apply_async()


def test_a_chain_carrying_an_unknown_policy_from_another_app_does_not_keep_a_job_from_ending():
    # Given a job whose chain's next step carries a policy no Keel call would have taken
    step = dict(celery_got.s().set(on_child_failure="skip"))
    job_id = add(
        "test.echo", {}, queue="default", opts=JobOptions(delay=600_000), ctx={"chain": [step]}
    ).job_id
    # When it is cancelled, it ends, and the chain stops there (as "fail" would)
    cancel(job_id, None)
    assert get(job_id).state == "cancelled"
    assert get(f"{job_id}.next") is None
