"""A key's line, step by step against the real Redis (``tasks.jobs.run.key_limits``): who
takes a slot, who waits, who is refused or superseded. The same with workers running the
jobs: ``test_key_limits.py``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tasks.broker import redis_client
from tasks.jobs.model.key_limits import KeyConcurrency
from tasks.jobs.run import key_limits, limits
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


@dataclass
class JobType:
    """What admission reads of a task: its name and its declared key limits."""

    name: str
    key_concurrency: KeyConcurrency | None = None
    key_rate: None = None


def ask(job_type: JobType, key: str, job_id: str) -> limits.Admission | str:
    """One delivery's admission: what it took, or why not ('held', 'refused')."""
    admission = limits.Admission()
    try:
        key_limits.admit(admission, job_type, {"k": key}, job_id)
    except limits.LimitReached:
        return "held"
    except key_limits.Superseded:
        return "refused"
    return admission


def line_of(job_type: JobType, key: str) -> list[str]:
    found = redis_client().zrange(f"{key_limits.KEY_PREFIX}:{job_type.name}:{key}:line", 0, -1)
    return [entry.decode() for entry in found]


def test_a_free_slot_goes_to_the_first_in_line_not_to_whoever_asks():
    job_type, key = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=1)), unique("k")
    first = ask(job_type, key, "a")
    assert isinstance(first, limits.Admission) and len(first.slots) == 1
    assert ask(job_type, key, "b") == "held"
    assert ask(job_type, key, "c") == "held"
    assert ask(job_type, key, "b") == "held"  # asking again keeps its place
    assert line_of(job_type, key) == ["b", "c"]
    limits.release(first)
    # The slot is free: c asks first, but b is ahead of it
    assert ask(job_type, key, "c") == "held"
    second = ask(job_type, key, "b")
    assert isinstance(second, limits.Admission)
    assert line_of(job_type, key) == ["c"]
    # and another key is not held by this one's line
    assert isinstance(ask(job_type, unique("k"), "d"), limits.Admission)
    limits.release(second)
    assert isinstance(ask(job_type, key, "c"), limits.Admission)


def test_max_running_slots_and_no_key_no_limit():
    job_type, key = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=2)), unique("k")
    assert all(isinstance(ask(job_type, key, j), limits.Admission) for j in ("a", "b"))
    assert ask(job_type, key, "c") == "held"
    no_key = limits.Admission()
    key_limits.admit(no_key, job_type, {"other": 1}, "d")
    assert no_key.slots == []


def test_cancel_newest_refuses_a_job_while_one_of_its_key_runs():
    job_type = JobType(unique("t.keyed"), KeyConcurrency("k", strategy="cancel_newest"))
    key = unique("k")
    first = ask(job_type, key, "a")
    assert isinstance(first, limits.Admission)
    assert ask(job_type, key, "b") == "refused"
    assert line_of(job_type, key) == []  # no line in this strategy
    limits.release(first)
    assert isinstance(ask(job_type, key, "c"), limits.Admission)
