"""Converting ``beat_schedule`` entries into job schedulers: pure logic, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule, solar
from pydantic import ValidationError

from tasks.celery import app
from tasks.jobs.model.schedule_rules import Rule, first_fire, next_fire
from tasks.jobs.schedule.beat_entries import EntryRefused, convert, cron_pattern
from tasks.jobs.schedule.schedulers import SchedulerSpec, StoredSpec


@pytest.mark.parametrize(
    ("entry", "pattern"),
    [
        (crontab(), "* * * * *"),
        (crontab(minute=0, hour=0), "0 0 * * *"),
        (crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"), "*/15 9-17 * * mon-fri"),
        (crontab(minute=30, hour=4, day_of_month="1,15"), "30 4 1,15 * *"),
        (crontab(minute=0, hour="*/6", month_of_year="2-4"), "0 */6 * 2-4 *"),
        # Forms cron does not read like Celery, written as the values they stand for
        (crontab(minute={5, 35}), "5,35 * * * *"),
        (crontab(minute=0, hour=12, day_of_week="saturday"), "0 12 * * 6"),
        (crontab(minute=0, hour=0, day_of_week=0), "0 0 * * 0"),  # 0 is Sunday in both
    ],
)
def test_a_crontab_becomes_the_cron_pattern_it_means(entry, pattern):
    assert cron_pattern(entry) == pattern


@pytest.mark.parametrize(
    "entry",
    [
        crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"),
        crontab(minute=0, hour=0, day_of_week="sun"),
        crontab(minute=30, hour=4, day_of_month="1,15"),
        crontab(minute=0, hour="*/6", month_of_year="2-4"),
        crontab(minute={5, 35}, hour=12, day_of_week="saturday"),
    ],
)
def test_the_pattern_fires_exactly_when_celery_would(entry):
    """Every minute of three weeks in Seoul: Keel fires on it iff Celery's crontab matches it."""
    tz = ZoneInfo("Asia/Seoul")
    rule = Rule(pattern=cron_pattern(entry), tz="Asia/Seoul")
    start = datetime(2027, 1, 20, tzinfo=tz)
    end = start + timedelta(weeks=3)

    def celery_matches(at: datetime) -> bool:
        return (
            at.minute in entry.minute
            and at.hour in entry.hour
            and at.day in entry.day_of_month
            and at.month in entry.month_of_year
            and at.isoweekday() % 7 in entry.day_of_week  # Celery: 0 = Sunday
        )

    count = int((end - start) / timedelta(minutes=1))
    minutes = (start + timedelta(minutes=n) for n in range(count))
    expected = [at.astimezone(UTC) for at in minutes if celery_matches(at)]
    fires = []
    fire = first_fire(rule, start.astimezone(UTC), new=True)
    while fire is not None and fire < end:
        fires.append(fire)
        fire = next_fire(rule, fire, fire)
    assert expected and fires == expected


def entry(**fields):
    return {"task": "test.echo", "schedule": 5.0, **fields}


def test_a_keel_job_entry_keeps_its_rule_data_and_queue():
    converted = convert(app, "nightly", entry(schedule=crontab(minute=30, hour=4), kwargs={"a": 1}))
    assert converted.scheduler_id == "beat:nightly" and not converted.plain
    assert converted.queue == "default"
    assert converted.spec.pattern == "30 4 * * *" and converted.spec.tz == "UTC"
    assert converted.spec.template.name == "test.echo"
    assert converted.spec.template.data == {"a": 1}  # test.echo takes its data as kwargs


@pytest.mark.parametrize(
    "value", [2, 2.0, timedelta(seconds=2), schedule(timedelta(seconds=2))], ids=repr
)
def test_periods_become_every_milliseconds(value):
    assert convert(app, "p", entry(schedule=value)).spec.every == 2000


def test_an_entry_may_repeat_its_tasks_own_queue():
    assert convert(app, "q", entry(options={"queue": "default"})).queue == "default"


def test_a_plain_celery_task_is_sent_as_is():
    converted = convert(
        app,
        "ping",
        {
            "task": "somebody.else.ping",
            "schedule": 10,
            "args": (1, "x"),
            "kwargs": {"k": True},
            "options": {"queue": "reports", "expires": 30},
        },
    )
    assert converted.plain and converted.queue == "reports"
    assert isinstance(converted.spec, StoredSpec)
    message = converted.spec.celeryMessage
    assert message is not None
    assert (message.args, message.kwargs) == ([1, "x"], {"k": True})
    assert message.options == {"queue": "reports", "expires": 30}
    assert converted.spec.template.name == "somebody.else.ping"


def unsolved_solar() -> solar:
    """A ``solar`` schedule (building one needs the ``ephem`` package; only its class counts)."""
    return solar.__new__(solar)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"schedule": unsolved_solar()}, "solar schedules are not supported"),
        ({"schedule": "every day"}, "is not a number, timedelta, schedule or crontab"),
        ({"schedule": 0.05}, "every: Input should be greater than or equal to 100"),
        (
            {"schedule": crontab(minute=0, hour=0, day_of_month=1, day_of_week="mon")},
            "limits both day_of_month and day_of_week",
        ),
        ({"options": {"queue": "reports"}}, "test.echo runs on queue 'default', not 'reports'"),
        ({"options": {"expires": 10}}, "option 'expires' has no meaning for a Keel job"),
        ({"args": [1]}, "takes its data as keyword arguments only"),
        ({"kwargs": {"when": datetime.now(UTC)}}, "must be JSON"),
        ({"relative": True}, "relative schedules are not supported"),
        ({"every": 5}, "unknown keys ['every']"),
        ({"task": None}, "no task named"),
    ],
)
def test_an_entry_that_cannot_be_converted_says_why(fields, reason):
    with pytest.raises(EntryRefused, match=reason.replace("[", r"\[").replace("]", r"\]")):
        convert(app, "bad", entry(**fields))


def test_the_api_form_of_a_scheduler_cannot_carry_a_plain_message():
    """Only beat's own entries (system scope) send plain Celery messages: a tenant's
    scheduler body with one is refused."""
    with pytest.raises(ValidationError, match="celeryMessage"):
        SchedulerSpec.model_validate(
            {"every": 1000, "template": {"name": "x"}, "celeryMessage": {"args": []}}
        )
