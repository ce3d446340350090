"""Retries, delays and deduplication with RabbitMQ as the broker.

The integration tests themselves, imported and run here against a real
``celery worker`` on RabbitMQ (they run in-process on Redis where they are
defined): the same requests and the same assertions, through quorum queues
and publisher confirms.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tasks.platform.broker import redis_client
from tests.integration.test_dedup import (
    test_fifty_concurrent_identical_submissions_make_one_job,
    test_same_request_while_unfinished_returns_the_live_job,
)
from tests.integration.test_retries import (
    submit,
    test_a_plain_error_uses_every_attempt,
    test_fail_until_attempt_2_completes_on_the_third_run,
    test_fail_until_attempt_5_fails_after_four_runs,
)
from tests.integration.test_scheduling import (
    test_a_report_scheduled_three_seconds_ahead_is_delayed_then_completed,
)
from tests.rabbitmq.conftest import amqp_url
from tests.support.client import wait_state
from tests.support.jobs import BEAT_TICKS_KEY, beat_tick
from tests.support.rabbitmq import is_quorum
from tests.support.stack import WorkerProcess, wait_for

__all__ = [
    "test_a_plain_error_uses_every_attempt",
    "test_a_report_scheduled_three_seconds_ahead_is_delayed_then_completed",
    "test_fail_until_attempt_2_completes_on_the_third_run",
    "test_fail_until_attempt_5_fails_after_four_runs",
    "test_fifty_concurrent_identical_submissions_make_one_job",
    "test_same_request_while_unfinished_returns_the_live_job",
]


@pytest.fixture(scope="module", autouse=True)
def rabbit_worker(stack, on_rabbitmq) -> Iterator[WorkerProcess]:
    """One worker consuming every queue, on RabbitMQ, for the module."""
    modules = {"KEEL_JOB_MODULES": "examples.hello_jobs"}  # a job module with its own queue
    process = WorkerProcess(stack.home, "rabbit-main", extra_env=modules)
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def failing(app, rabbit_worker) -> dict[int, str]:
    """As ``tests.integration.test_retries.failing``, with the worker on RabbitMQ."""
    client = app.test_client()
    return {n: submit(client, failUntilAttempt=n) for n in (2, 5)}


def test_the_queues_are_quorum_queues(on_rabbitmq):
    # Given the worker declared Keel's queues on its start
    url = amqp_url(on_rabbitmq)
    # Then each is a quorum queue
    assert {name: is_quorum(url, name) for name in ("reports", "notifications", "default")} == {
        "reports": True,
        "notifications": True,
        "default": True,
    }


def test_a_job_module_queue_is_declared_alike_by_worker_and_publisher(on_rabbitmq):
    # Given a worker that loaded a job module whose task has a queue of its own ("hello")
    from examples.hello_jobs import greet

    # When this process sends it the Celery way
    job_id = greet.delay("rabbit").id
    # Then it ran, and its queue is a quorum queue (declared so by the worker first; a
    # publisher declaring it otherwise would have been refused by RabbitMQ)
    assert wait_state(job_id, "completed", timeout=30)["result"] == "hello, rabbit"
    assert is_quorum(amqp_url(on_rabbitmq), "hello")


def test_a_plain_celery_task_sent_with_a_countdown_runs_after_it(on_rabbitmq):
    """Celery's native delayed delivery (quorum queues) serves tasks that are not Keel's."""
    # Given a plain Celery task (no job record), sent with a 2 s countdown
    sent_at = time.monotonic()
    task_id = beat_tick.apply_async(countdown=2).id
    # Then it runs once, after its countdown
    wait_for(lambda: task_id.encode() in redis_client().lrange(BEAT_TICKS_KEY, 0, -1), timeout=30)
    assert time.monotonic() - sent_at >= 2
    assert redis_client().lrange(BEAT_TICKS_KEY, 0, -1).count(task_id.encode()) == 1
