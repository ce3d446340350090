"""The RabbitMQ tier: Keel with ``KEEL_BROKER_URL`` on RabbitMQ, real ``celery worker`` processes.

The node is the tier's own (``tests.support.rabbitmq.RabbitNode``: a private
``rabbitmq-server`` on ports of its own, removed at the end), or the one
``KEEL_TEST_AMQP_URL`` names. Each module runs on a database of its own, so
no worker of another tier — they publish to Redis — promotes its jobs; Redis
is the session's, as a deployment on RabbitMQ still keeps its events,
limits, metrics and heartbeats there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.support.client import unique
from tests.support.databases import fresh_database
from tests.support.rabbitmq import RabbitNode, using_broker
from tests.support.stack import WorkerProcess


@pytest.fixture(scope="session")
def rabbitmq(stack) -> Iterator[RabbitNode | str]:
    """The tier's RabbitMQ node (stopped and removed at the end), or ``KEEL_TEST_AMQP_URL``."""
    given = os.environ.get("KEEL_TEST_AMQP_URL")
    if given:
        yield given
        return
    node = RabbitNode()
    try:
        node.start()
        yield node
    finally:
        node.remove()


def amqp_url(rabbitmq: RabbitNode | str) -> str:
    return rabbitmq if isinstance(rabbitmq, str) else rabbitmq.url


def own_node(rabbitmq: RabbitNode | str) -> RabbitNode:
    """The tier's own node, for tests that stop or freeze it; they skip on a given one."""
    if isinstance(rabbitmq, str):
        pytest.skip("KEEL_TEST_AMQP_URL names a RabbitMQ that is not ours to stop")
    return rabbitmq


@pytest.fixture(scope="module")
def on_rabbitmq(stack, rabbitmq) -> Iterator[RabbitNode | str]:
    """This module's database, and Celery's messages on RabbitMQ (here and in its workers)."""
    with fresh_database(), using_broker(amqp_url(rabbitmq)):
        yield rabbitmq


@pytest.fixture
def spawn(stack, on_rabbitmq) -> Iterator[Callable[..., WorkerProcess]]:
    """Start a ``celery worker`` on RabbitMQ named after ``prefix``; all stopped at teardown."""
    started: list[WorkerProcess] = []

    def start(prefix: str, **options) -> WorkerProcess:
        process = WorkerProcess(stack.home, unique(prefix), **options)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop(timeout=20)
