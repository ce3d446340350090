"""Which override of a job type's key limits a key takes (``tasks.jobs.model.key_overrides``):
pure rules, no I/O."""

from __future__ import annotations

import pytest

from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
from tasks.jobs.model.key_overrides import (
    KeyOverride,
    OverrideRefused,
    checked,
    concurrency_of,
    deciding,
    key_matches,
    ordered,
    pattern_problem,
    rate_of,
)

DECLARED = KeyConcurrency("partner", max_running=3)
RATE = KeyRate("partner", max=10, per="1s")


def rule(tenant: str, key: str, **limits: object) -> KeyOverride:
    return KeyOverride("partner.call", tenant, key, limits)


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("partner-7", "partner-7", True),
        ("partner-7", "partner-70", False),
        ("partner-*", "partner-70", True),
        ("partner-*", "partner-", True),
        ("partner-*", "xpartner-7", False),
        ("*-eu", "partner-eu", True),
        ("*", "anything at all", True),
        ("a*b*c", "a-b-c", True),
        ("p?[1]", "p?[1]", True),  # only * is special
        ("p?[1]", "px1", False),
        ("a.c", "abc", False),  # regex characters are themselves
    ],
)
def test_a_pattern_names_keys_with_star_alone_special(pattern, key, matches):
    assert key_matches(pattern, key) is matches


RULES = ordered(
    [
        rule("*", "*", max_running=5),
        rule("*", "partner-*", max_running=2),
        rule("*", "partner-eu-*", max_running=4),
        rule("acme", "*", max_running=8),
        rule("acme", "partner-*", max_running=6),
        rule("*", "partner-7", max_running=1),
        rule("acme", "partner-7", max_running=9),
    ]
)


@pytest.mark.parametrize(
    ("tenant", "key", "decided_by", "running"),
    [
        ("globex", "other", ("*", "*"), 5),  # * of any tenant
        ("acme", "other", ("acme", "*"), 8),  # the tenant's own * beats any tenant's
        ("globex", "partner-3", ("*", "partner-*"), 2),  # a pattern beats *
        ("acme", "partner-3", ("acme", "partner-*"), 6),
        ("globex", "partner-eu-1", ("*", "partner-eu-*"), 4),  # the longer pattern wins
        ("acme", "partner-eu-1", ("*", "partner-eu-*"), 4),  # the key before the tenant
        ("globex", "partner-7", ("*", "partner-7"), 1),  # an exact key beats every pattern
        ("acme", "partner-7", ("acme", "partner-7"), 9),  # and the tenant's exact key, it
        (None, "partner-7", ("*", "partner-7"), 1),  # a system job: the * tenant's only
    ],
)
def test_the_most_specific_override_decides(tenant, key, decided_by, running):
    found = deciding(RULES, tenant, key, "max_running")
    assert found is not None
    assert (found.tenant, found.key) == decided_by
    assert concurrency_of(DECLARED, found) == KeyConcurrency("partner", max_running=running)


def test_each_field_is_decided_on_its_own():
    # Given an exact key that sets the rate only, and a pattern that sets max_running
    rules = ordered(
        [
            rule("*", "partner-7", rate={"max": 1, "per_ms": 60_000}),
            rule("*", "partner-*", max_running=2),
        ]
    )
    # Then the pattern decides max_running and the exact key the rate
    assert concurrency_of(DECLARED, deciding(rules, "t", "partner-7", "max_running")) == (
        KeyConcurrency("partner", max_running=2)
    )
    assert rate_of(RATE, deciding(rules, "t", "partner-7", "rate")) == KeyRate(
        "partner", max=1, per=60_000
    )
    # And a key no override names keeps the declaration
    assert deciding(rules, "t", "other", "rate") is None
    assert rate_of(RATE, None) is RATE
    assert concurrency_of(DECLARED, None) is DECLARED


def test_null_lifts_the_limit():
    lifted = rule("*", "*", max_running=None, rate=None)
    assert concurrency_of(DECLARED, lifted) is None
    assert rate_of(RATE, lifted) is None


def test_a_tie_goes_to_the_pattern_first_in_text_order():
    found = deciding(
        ordered([rule("*", "*a", max_running=2), rule("*", "a*", max_running=3)]),
        "t",
        "aa",
        "max_running",
    )
    assert found is not None and found.key == "*a"


def test_another_tenants_override_never_holds():
    rules = ordered([rule("acme", "*", max_running=1)])
    assert deciding(rules, "globex", "partner-7", "max_running") is None
    assert deciding(rules, None, "partner-7", "max_running") is None


@pytest.mark.parametrize(
    ("given", "concurrency", "rate", "field"),
    [
        ({}, DECLARED, RATE, "limits"),
        ({"burst": 2}, DECLARED, RATE, "limits"),
        ({"max_running": 0}, DECLARED, RATE, "max_running"),
        ({"max_running": 10_001}, DECLARED, RATE, "max_running"),
        ({"max_running": True}, DECLARED, RATE, "max_running"),
        ({"max_running": 2}, None, RATE, "max_running"),  # declares no key_concurrency
        ({"max_running": 2}, KeyConcurrency("r", strategy="cancel_newest"), None, "max_running"),
        ({"rate": {"max": 1, "per_ms": 1000}}, DECLARED, None, "rate"),  # no key_rate
        ({"rate": {"max": 0, "per_ms": 1000}}, DECLARED, RATE, "rate.max"),
        ({"rate": {"max": 1, "per_ms": 86_400_001}}, DECLARED, RATE, "rate.per_ms"),
        ({"rate": {"max": 1}}, DECLARED, RATE, "rate"),
    ],
)
def test_a_wrong_override_is_refused_naming_the_field(given, concurrency, rate, field):
    with pytest.raises(OverrideRefused) as refused:
        checked(given, concurrency, rate)
    assert refused.value.field == field


def test_a_right_override_keeps_the_fields_given():
    assert checked({"max_running": None}, DECLARED, RATE) == {"max_running": None}
    assert checked({"rate": {"max": 2, "per_ms": 500}, "max_running": 4}, DECLARED, RATE) == {
        "max_running": 4,
        "rate": {"max": 2, "per_ms": 500},
    }


@pytest.mark.parametrize(
    ("pattern", "ok"), [("partner-*", True), ("", False), ("x" * 101, False), ("a\nb", False)]
)
def test_a_pattern_is_1_to_100_characters_without_a_control_one(pattern, ok):
    assert (pattern_problem(pattern) is None) is ok
