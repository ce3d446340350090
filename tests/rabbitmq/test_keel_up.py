"""``keel up`` with ``KEEL_BROKER_URL`` on RabbitMQ: the whole stack, Celery's messages there.

Postgres and Redis are ``keel up``'s embedded ones (Keel's events, limits and
heartbeats stay in Redis); the broker is the tier's RabbitMQ node.
"""

from __future__ import annotations

import signal

import pytest
import requests

from tests.acceptance.test_keel_up import run_report
from tests.rabbitmq.conftest import amqp_url
from tests.support.keel_up import KeelUp
from tests.support.rabbitmq import RabbitNode

pytestmark = pytest.mark.stack


def test_keel_up_on_rabbitmq_runs_a_report(tmp_path, rabbitmq: RabbitNode | str):
    up = KeelUp(tmp_path / "home")
    up.env["KEEL_BROKER_URL"] = amqp_url(rabbitmq)
    up.start()
    try:
        # The stack says where its messages go, and its API checks that broker
        assert up.stack_env["KEEL_BROKER_URL"] == amqp_url(rabbitmq)
        ready = requests.get(f"{up.web}/readyz", timeout=5).json()
        assert ready["checks"] == {"postgres": "ok", "redis": "ok", "rabbitmq": "ok"}, ready
        # And a report posted to its web service completes
        job = run_report(up, rows=200)
        assert job["state"] == "completed" and job["attemptsStarted"] == 1
        # It went through RabbitMQ: the queue is declared there (our own node: we can ask it);
        # the API publishes only there, so the worker that ran it consumes from there
        if isinstance(rabbitmq, RabbitNode):
            listed = rabbitmq.ctl("list_queues", "-q", "name")
            assert "reports" in listed.stdout.split(), listed.stdout
    finally:
        code, _ = up.stop(signal.SIGINT)
    assert code == 0, up.log_tail()
