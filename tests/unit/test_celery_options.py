"""How a Celery call's options become a job's (``tasks.jobs.intake.celery_options``): pure
logic, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from celery import signature

from tasks.jobs.intake.celery_options import canvas_context, delay_ms, job_options
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


class Task:
    """A stand-in for a Keel task: its own options are three attempts."""

    def default_options(self, data: dict, owner: Owner | None) -> JobOptions:
        return JobOptions(attempts=3)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, 0),
        ({"countdown": 0}, 0),
        ({"countdown": 1.5}, 1500),
        ({"countdown": 0.0001}, 1),  # rounded up: never earlier than asked
        ({"countdown": -5}, 0),
        ({"eta": NOW + timedelta(seconds=30)}, 30_000),
        ({"eta": (NOW + timedelta(seconds=2)).isoformat()}, 2000),
        ({"eta": NOW - timedelta(hours=1)}, 0),  # past: due now
        ({"eta": datetime(2026, 12, 3, 12, 0, 10)}, 10_000),  # naive: UTC, as Celery's
        ({"countdown": 1, "eta": NOW + timedelta(hours=1)}, 1000),  # countdown wins
    ],
)
def test_countdown_and_eta_become_a_delay(options, expected):
    assert delay_ms(options, NOW) == expected


def test_the_calls_options_override_the_tasks_and_name_the_job():
    opts = job_options(
        Task(),
        {},
        None,
        {"task_id": "given-id", "job_options": {"attempts": 5}, "countdown": 2},
    )
    assert opts.attempts == 5
    assert opts.job_id == "given-id"
    assert 1900 <= opts.delay <= 2000  # measured from now, rounded up


def test_a_job_options_object_and_expires_map_too():
    opts = job_options(Task(), {}, None, {"job_options": JobOptions(attempts=2), "expires": 60})
    assert opts.attempts == 2
    assert opts.expires_at is not None
    left = (datetime.fromisoformat(str(opts.expires_at)) - datetime.now(UTC)).total_seconds()
    assert 55 <= left <= 60


def test_without_options_the_tasks_own_are_kept():
    opts = job_options(Task(), {}, None, {})
    assert (opts.attempts, opts.delay, opts.job_id) == (3, 0, None)


def test_canvas_options_are_kept_as_plain_values():
    link = signature("test.echo", args=(1,))
    ctx = canvas_context(
        {
            "group_id": "g1",
            "group_index": 0,
            "root_id": "r",
            "parent_id": "p",
            "link": link,
            "chain": [signature("test.echo", options={"eta": NOW})],
            "countdown": 5,  # not canvas: not kept
        }
    )
    assert ctx["group"] == "g1" and ctx["group_index"] == 0
    assert (ctx["root_id"], ctx["parent_id"]) == ("r", "p")
    assert [type(x) for x in ctx["link"]] == [dict] and ctx["link"][0]["task"] == "test.echo"
    assert ctx["chain"][0]["options"]["eta"] == NOW.isoformat()  # JSON-ready
    assert "countdown" not in ctx
