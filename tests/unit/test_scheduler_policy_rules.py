"""Scheduler policies as pure rules: which missed slot fires after downtime, the jitter of a
slot, what is stored and shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from tasks.jobs.model.schedule_rules import (
    Policy,
    Rule,
    after_fire,
    due_slot,
    jitter_ms,
    last_slot,
    policy_of,
)

DUE = datetime(2026, 11, 29, 9, 30, 0, tzinfo=UTC)
EVERY_2S = Rule(every=2000)
EVEN_SECONDS = Rule(pattern="*/2 * * * * *", tz="Asia/Seoul")


def after(seconds: float) -> datetime:
    return DUE + timedelta(seconds=seconds)


@pytest.mark.parametrize("rule", [EVERY_2S, EVEN_SECONDS], ids=["every", "pattern"])
def test_by_default_the_earliest_missed_slot_fires_once_then_the_first_after_now(rule):
    # Given a beat away for 21.5 s (slots at 0, 2, ..., 20 missed)
    policy, now = Policy(), after(21.5)
    # When it comes back
    slot = due_slot(rule, policy, DUE, now)
    # Then today's behaviour: the first missed slot, and next the one after now
    assert slot == DUE
    assert after_fire(rule, policy, slot, now) == after(22)


@pytest.mark.parametrize("rule", [EVERY_2S, EVEN_SECONDS], ids=["every", "pattern"])
def test_catch_up_latest_fires_the_last_missed_slot_once(rule):
    policy, now = Policy(catchUp="latest"), after(21.5)
    slot = due_slot(rule, policy, DUE, now)
    assert slot == after(20)
    assert after_fire(rule, policy, slot, now) == after(22)


def test_catch_up_all_fires_each_missed_slot_in_turn():
    policy, now = Policy(catchUp="all"), after(5)
    slots, due = [], DUE
    while (slot := due_slot(EVERY_2S, policy, due, now)) is not None:
        slots.append(slot)
        due = after_fire(EVERY_2S, policy, slot, now)
    assert slots == [DUE, after(2), after(4)]
    assert due == after(6)


def test_the_catch_up_window_drops_older_slots():
    # Given missed slots 0..20 and a 5 s window at 21.5 s
    all_in_window = Policy(catchUp="all", catchUpWindow=5000)
    assert due_slot(EVERY_2S, all_in_window, DUE, after(21.5)) == after(18)
    assert due_slot(EVERY_2S, Policy(catchUpWindow=5000), DUE, after(21.5)) == after(18)
    # And a window shorter than the time since the last slot fires none
    assert due_slot(Rule(every=60_000), Policy(catchUpWindow=1000), DUE, after(30)) is None


def test_a_slot_on_time_is_the_same_for_every_catch_up():
    for catch_up in ("earliest", "latest", "all"):
        assert due_slot(EVERY_2S, Policy(catchUp=catch_up), DUE, after(0.3)) == DUE


def test_the_last_slot_stops_at_the_end_date():
    rule = Rule(every=2000, endDate=after(7))
    assert last_slot(rule, DUE, after(60)) == after(6)


def test_jitter_is_within_bounds_fixed_per_slot_and_spread():
    policy = Policy(jitter=1000)
    delays = [jitter_ms(policy, f"repeat:abc:{n}") for n in range(200)]
    assert all(0 <= d < 1000 for d in delays)
    assert delays == [jitter_ms(policy, f"repeat:abc:{n}") for n in range(200)]
    assert len(set(delays)) > 150
    assert jitter_ms(Policy(), "repeat:abc:1") == 0


def test_defaults_are_stored_as_nothing_and_shown_whole():
    assert Policy().stored() is None
    assert policy_of(None).view() == {
        "overlap": "allow",
        "catchUp": "earliest",
        "jitter": 0,
        "paused": False,
    }
    kept = Policy(overlap="skip", jitter=50, paused=True).stored()
    assert kept == {"overlap": "skip", "jitter": 50, "paused": True}
    assert policy_of(kept).view()["paused"] is True


@pytest.mark.parametrize(
    "bad",
    [
        {"overlap": "queue"},
        {"catchUp": "none"},
        {"catchUpWindow": 10},
        {"jitter": -1},
        {"paused": "maybe"},
        {"pausd": True},
    ],
)
def test_bad_policies_are_refused(bad):
    with pytest.raises(ValidationError):
        Policy.model_validate(bad)


# --- in a beat_schedule entry's options ----------------------------------------------------


def test_a_keel_jobs_entry_takes_policies_in_its_options():
    from tasks.celery import app
    from tasks.jobs.schedule.beat_entries import convert

    entry = {
        "task": "test.echo",
        "schedule": 60.0,
        "kwargs": {"n": 3},
        "options": {"overlap": "skip", "catchUp": "latest", "jitter": 500, "paused": True},
    }
    spec = convert(app, "echo", entry).spec
    assert (spec.overlap, spec.catchUp, spec.jitter, spec.paused) == ("skip", "latest", 500, True)
    assert convert(app, "echo", {**entry, "options": {}}).spec.paused is None  # as it was


def test_a_plain_tasks_entry_keeps_its_celery_options_apart_and_allows_overlap_only():
    from tasks.celery import app
    from tasks.jobs.schedule.beat_entries import EntryRefused, convert

    entry = {
        "task": "test.beat_tick",
        "schedule": 1.0,
        "options": {"priority": 3, "catchUp": "all", "catchUpWindow": 5000},
    }
    conversion = convert(app, "tick", entry)
    assert conversion.plain and conversion.spec.catchUp == "all"
    assert conversion.spec.celeryMessage.options == {"priority": 3}
    with pytest.raises(EntryRefused, match="overlap"):
        convert(app, "tick", {**entry, "options": {"overlap": "skip"}})
    with pytest.raises(EntryRefused, match="jitter"):
        convert(app, "tick", {**entry, "options": {"jitter": "soon"}})


def test_an_entry_catching_up_every_slot_needs_a_window():
    from tasks.celery import app
    from tasks.jobs.schedule.beat_entries import EntryRefused, convert

    entry = {"task": "test.echo", "schedule": 1.0, "options": {"catchUp": "all"}}
    with pytest.raises(EntryRefused, match="catchUpWindow is required"):
        convert(app, "echo", entry)
    with pytest.raises(EntryRefused, match="catchUpWindow is required"):
        convert(app, "tick", {**entry, "task": "test.beat_tick"})
    entry["options"]["catchUpWindow"] = 60_000
    assert convert(app, "echo", entry).spec.catchUpWindow == 60_000
