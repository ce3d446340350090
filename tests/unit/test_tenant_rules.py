"""Pure rules behind tenant fairness and template bounds."""

from __future__ import annotations

import random

import pytest

from tasks.jobs.intake.tenancy import PRIORITY_STEPS, priority_for
from tasks.notifications.templates import Shape, batches, longest, render
from tasks.platform.setting_types import parse_tenant_quotas as parse


@pytest.mark.parametrize(
    ("load", "priority"), [(0, 0), (1, 3), (3, 3), (4, 6), (15, 6), (16, 9), (10_000, 9)]
)
def test_a_tenants_load_on_a_queue_lowers_its_next_jobs_priority(load, priority):
    assert priority_for(load) == priority
    assert priority in PRIORITY_STEPS


@pytest.mark.parametrize(
    "template", ["hi {name}", "{a}{a}{b} {{literal}} {a}", "no fields", "{x}" * 50, "{{}}{a}"]
)
def test_the_measured_length_is_the_rendered_length(template):
    rng = random.Random(7)
    for _ in range(50):
        values = {
            k: rng.choice(
                [
                    "",
                    "é" * rng.randint(0, 9),
                    rng.randint(-999, 999),
                    None,
                    True,
                    2.5,
                    [1, "x"],
                    {"k": "v"},
                ]
            )
            for k in rng.sample(["a", "b", "name", "x", "unused"], 3)
        }
        assert Shape.of(template).length(values) == len(render(template, values))


def test_longest_is_the_maximum_over_recipients():
    assert longest("{a}!", [{"a": "xx"}, {"a": "xxxxx"}, {}]) == 6
    assert longest("fixed", []) == 5


def test_batches_stay_within_the_count_and_the_text_budget():
    messages = [{"messageId": str(i), "to": "t", "text": "z" * 3000} for i in range(2500)]
    sizes = [(len(b), sum(len(m["text"]) for m in b)) for b in batches(iter(messages))]
    assert sum(n for n, _ in sizes) == 2500
    assert all(n <= 1000 and chars <= 1_000_000 for n, chars in sizes)
    short = [{"messageId": str(i), "to": "t", "text": "z"} for i in range(2500)]
    assert [len(b) for b in batches(iter(short))] == [1000, 1000, 500]


def test_quotas_default_and_refuse_malformed_values():
    assert parse("").live_jobs == 10_000
    assert parse('{"liveJobs": 7}').live_jobs == 7
    for bad in ('{"liveJobs": "7"}', '{"unknown": 1}', "[1]", "not json", '{"schedulers": -1}'):
        with pytest.raises(ValueError, match="KEEL_TENANT_QUOTAS"):
            parse(bad)


@pytest.mark.parametrize(
    "template", ["{to.__class__}", "{seq:>2000000000}", "{0}", "{}", "{seq!r}", "{a[0]}"]
)
def test_a_template_beyond_plain_names_is_never_rendered(template):
    # Given a template the API refuses (attribute access, a format spec, positional fields)
    # When a worker would render it (a campaign recorded some other way) it refuses too
    with pytest.raises(ValueError, match="placeholders"):
        render(template, {"seq": 1, "to": "x", "a": [1]})


def test_rendering_fills_names_and_leaves_missing_ones_empty():
    assert render("{{hi}} {name}, {missing}!", {"name": "Ada"}) == "{hi} Ada, !"
    assert render("{n}{flag}{none}", {"n": 2.5, "flag": True, "none": None}) == "2.5TrueNone"
