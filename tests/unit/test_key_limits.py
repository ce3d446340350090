"""The declarations of limits by key (``tasks.jobs.model.key_limits``): pure logic."""

from __future__ import annotations

import pytest

from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate, key_value, window_ms


@pytest.mark.parametrize(
    ("per", "ms"),
    [("500ms", 500), ("1s", 1000), ("1.5s", 1500), ("1m", 60_000), ("2h", 7_200_000), (250, 250)],
)
def test_a_window_reads_as_milliseconds(per, ms):
    assert window_ms(per) == ms
    assert KeyRate("k", max=1, per=per).per_ms == ms


@pytest.mark.parametrize("per", ["", "1d", "soon", "-1s", "1 minute", 0, 86_400_001, True, None])
def test_a_malformed_window_is_refused(per):
    with pytest.raises(ValueError, match="window"):
        KeyRate("k", max=1, per=per)


def test_a_key_is_a_field_of_the_data_or_a_function_of_it():
    assert key_value("customerId", {"customerId": "acme"}) == "acme"
    assert key_value("customerId", {"customerId": 42}) == "42"
    assert key_value(lambda d: f"{d['org']}/{d['repo']}", {"org": "a", "repo": "b"}) == "a/b"
    # no value: no key, no limit
    assert key_value("customerId", {}) is None
    assert key_value("customerId", {"customerId": ""}) is None
    assert key_value(lambda d: None, {"x": 1}) is None


def test_a_long_or_unprintable_key_is_kept_as_its_hash():
    long = key_value("k", {"k": "x" * 500})
    assert long is not None and long.startswith("sha256:") and len(long) == 71
    assert key_value("k", {"k": "line\nbreak"}).startswith("sha256:")
    assert key_value("k", {"k": {"b": 1, "a": 2}}) == key_value("k", {"k": {"a": 2, "b": 1}})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": ""}, "key"),
        ({"key": 5}, "key"),
        ({"key": "k", "max_running": 0}, "max_running"),
        ({"key": "k", "max_running": True}, "max_running"),
        ({"key": "k", "strategy": "newest"}, "strategy"),
        ({"key": "k", "strategy": "cancel_newest", "max_running": 2}, "max_running=1"),
    ],
)
def test_a_bad_concurrency_declaration_is_refused_when_declared(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KeyConcurrency(**kwargs)


@pytest.mark.parametrize("max_starts", [0, -1, 1.5, True])
def test_a_key_rate_needs_a_positive_whole_max(max_starts):
    with pytest.raises(ValueError, match="max"):
        KeyRate("k", max=max_starts)
