"""Which broker carries Celery's messages: Keel's Redis, unless ``KEEL_BROKER_URL`` names RabbitMQ.

The RabbitMQ tier (``tests/rabbitmq``) runs Keel on a real RabbitMQ; these
check the settings each choice produces, without one.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from keel.cli import main
from tasks.celeryconfig import broker_options
from tasks.jobs.intake.tenancy import PRIORITY_STEPS, broker_priority
from tasks.platform.config import Settings, reload_settings

REDIS = "redis://:secret@redis-host:6379/0"
REDIS_ONLY_OPTIONS = {
    "visibility_timeout",
    "unacked_restore_interval",
    "unacked_restore_throttle",
    "unacked_mutex_expire",
    "priority_steps",
    "socket_timeout",
}


def test_without_a_broker_url_messages_go_through_redis():
    options = broker_options(Settings(redis_url=REDIS))
    assert options["broker_url"] == REDIS
    assert options["broker_transport"] == "tasks.platform.transport:Transport"
    assert set(options["broker_transport_options"]) >= REDIS_ONLY_OPTIONS


def test_an_amqp_url_means_rabbitmq_quorum_queues_and_publisher_confirms():
    url = "amqp://keel:pw@mq-host:5672/keel"
    options = broker_options(Settings(redis_url=REDIS, broker_url=url))
    assert options["broker_url"] == url
    assert options["broker_transport"] == "tasks.platform.rabbitmq:Transport"
    assert options["broker_transport_options"]["confirm_publish"] is True
    assert not REDIS_ONLY_OPTIONS & set(options["broker_transport_options"])
    queues = options["task_queues"]
    assert {q.name for q in queues} == {"reports", "notifications", "default", "webhooks"}
    assert all(q.queue_arguments == {"x-queue-type": "quorum"} for q in queues)
    assert options["task_create_missing_queue_type"] == "quorum"


def test_amqps_keeps_tls():
    options = broker_options(Settings(redis_url=REDIS, broker_url="amqps://keel:pw@mq-host/keel"))
    assert options["broker_transport"] == "tasks.platform.rabbitmq:SSLTransport"


@pytest.mark.parametrize("url", ["redis://other:6379/1", "http://mq-host", "mq-host:5672"])
def test_a_broker_url_that_is_not_amqp_is_refused_at_start(url):
    with pytest.raises(ValidationError, match="broker_url"):
        Settings(redis_url=REDIS, broker_url=url)


def test_tenant_priorities_are_turned_around_for_amqp(monkeypatch):
    # kombu's Redis lists serve priority 0 first; AMQP serves the highest first
    assert [broker_priority(p) for p in PRIORITY_STEPS] == list(PRIORITY_STEPS)
    monkeypatch.setenv("KEEL_BROKER_URL", "amqp://mq-host//")
    reload_settings()
    try:
        assert [broker_priority(p) for p in PRIORITY_STEPS] == list(reversed(PRIORITY_STEPS))
    finally:
        monkeypatch.undo()
        reload_settings()


def test_republish_refuses_on_rabbitmq_saying_why(monkeypatch):
    # Given Celery's messages on RabbitMQ, whose queues cannot be listed
    monkeypatch.setenv("KEEL_BROKER_URL", "amqp://mq-host//")
    reload_settings()
    try:
        # When an operator asks Keel to republish the jobs whose message was lost
        result = CliRunner().invoke(main, ["jobs", "republish"])
    finally:
        monkeypatch.undo()
        reload_settings()
    # Then it refuses instead of guessing, and says why
    assert result.exit_code == 1
    assert "RabbitMQ" in result.output and "cannot tell which" in result.output
