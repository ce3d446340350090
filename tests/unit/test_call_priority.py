"""A call's ``priority=`` as a job's rank (0 first), in each broker's direction."""

from __future__ import annotations

import pytest

from tasks.jobs.intake.tenancy import rank


@pytest.mark.parametrize(
    ("priority", "redis", "amqp"),
    [
        (None, 0, 9),  # none given: Redis serves it first, RabbitMQ last
        (0, 0, 9),
        (3, 3, 6),
        (9, 9, 0),
        (12, 9, 0),  # past 9: the last rank there is (RabbitMQ's queues allow up to 255)
        (-1, 0, 9),
    ],
)
def test_a_priority_keeps_its_broker_s_direction(priority, redis, amqp):
    assert rank(priority, on_amqp=False) == redis
    assert rank(priority, on_amqp=True) == amqp


@pytest.mark.parametrize("priority", ["high", 1.5, True, "3"])
def test_anything_but_a_whole_number_is_refused(priority):
    with pytest.raises(ValueError, match="priority must be a whole number from 0 to 9"):
        rank(priority, on_amqp=False)
