"""When job schedulers fire: cron with seconds and time zones, every, limits, dates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from tasks.jobs.model.schedule_rules import JobTemplate, Rule, first_fire, next_fire

NOW = datetime(2026, 11, 29, 9, 30, 15, 250_000, tzinfo=UTC)  # 18:30:15.25 in Seoul


def test_daily_cleanup_fires_at_three_in_seoul():
    rule = Rule(pattern="0 0 3 * * *", tz="Asia/Seoul")
    assert first_fire(rule, NOW, new=True) == datetime(2026, 11, 29, 18, 0, tzinfo=UTC)


def test_six_fields_put_seconds_first():
    rule = Rule(pattern="*/2 * * * * *", tz="Asia/Seoul")
    fire = first_fire(rule, NOW, new=True)
    assert fire == datetime(2026, 11, 29, 9, 30, 16, tzinfo=UTC)
    assert next_fire(rule, fire, fire) == fire + timedelta(seconds=2)


def test_five_fields_are_minutes_first():
    rule = Rule(pattern="*/5 * * * *", tz="UTC")
    assert first_fire(rule, NOW, new=True) == datetime(2026, 11, 29, 9, 35, tzinfo=UTC)


def test_pattern_waits_for_its_match_unless_immediately():
    rule = Rule(pattern="0 0 3 * * *", tz="Asia/Seoul", immediately=True)
    assert first_fire(rule, NOW, new=False) == NOW


def test_a_new_every_fires_at_once_then_every_period():
    rule = Rule(every=1000)
    assert first_fire(rule, NOW, new=True) == NOW
    assert next_fire(rule, NOW, NOW) == NOW + timedelta(seconds=1)


def test_missed_every_fires_are_not_back_filled():
    rule = Rule(every=1000)
    later = NOW + timedelta(seconds=10, milliseconds=500)
    assert next_fire(rule, later, NOW) == NOW + timedelta(seconds=11)


def test_end_date_stops_and_start_date_delays():
    rule = Rule(every=1000, startDate=NOW + timedelta(hours=1))
    assert first_fire(rule, NOW, new=True) == NOW + timedelta(hours=1)
    ending = Rule(every=1000, endDate=NOW + timedelta(milliseconds=500))
    assert next_fire(ending, NOW, NOW) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"pattern": "* * *"},
        {"pattern": "61 * * * *"},
        {"pattern": "* * * * *", "every": 1000},
        {},
        {"every": 1000, "tz": "Mars/Olympus"},
    ],
)
def test_invalid_rules_are_rejected(bad):
    with pytest.raises(ValidationError):
        Rule.model_validate(bad)


def test_a_template_cannot_choose_the_job_id():
    with pytest.raises(ValidationError, match="jobId"):
        JobTemplate.model_validate({"name": "x", "opts": {"jobId": "fixed"}})
