"""How a queue's live override and its ``KEEL_QUEUE_LIMITS`` default make the limits in
force (``tasks.jobs.run.live_limits.merged`` / ``stored``): pure rules, no servers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.jobs.run.live_limits import merged, stored
from tasks.platform.setting_types import QueueLimit, Rate

DEFAULT = QueueLimit(concurrency=4, rate=Rate(max=10, duration_ms=1000))


def test_no_override_is_the_default():
    assert merged(DEFAULT, None) == DEFAULT
    assert merged(None, None) is None


def test_a_field_given_replaces_the_defaults_and_one_left_out_keeps_it():
    limit = merged(DEFAULT, {"concurrency": 1})
    assert limit == QueueLimit(concurrency=1, rate=Rate(max=10, duration_ms=1000))


def test_a_null_field_is_unlimited_and_no_field_limiting_is_none():
    assert merged(DEFAULT, {"rate": None}) == QueueLimit(concurrency=4)
    assert merged(DEFAULT, {"concurrency": None, "rate": None}) is None


def test_an_override_limits_a_queue_with_no_default():
    assert merged(None, {"concurrency": 2}) == QueueLimit(concurrency=2)


def test_stored_keeps_only_the_fields_given():
    rate = Rate(max=5, duration_ms=100)
    assert stored(2, rate, {"concurrency"}) == {"concurrency": 2}
    assert stored(None, rate, {"concurrency", "rate"}) == {
        "concurrency": None,
        "rate": {"max": 5, "duration_ms": 100},
    }


@pytest.mark.parametrize(("concurrency", "given"), [(0, {"concurrency"}), (2, set()), (2, {"x"})])
def test_stored_refuses_what_the_setting_would(concurrency, given):
    with pytest.raises((ValueError, ValidationError)):
        stored(concurrency, None, given)
