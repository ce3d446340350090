"""A key's line, step by step against the real Redis (``tasks.jobs.run.key_limits``): who
takes a slot, who waits, who is refused or superseded. The same with workers running the
jobs: ``test_key_limits.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tasks.jobs import JobOptions, add
from tasks.jobs.end.cancel import cancel
from tasks.jobs.model.key_limits import KeyConcurrency
from tasks.jobs.observe.queries import get
from tasks.jobs.run import key_limits, limits
from tasks.platform.broker import redis_client
from tests.support import broker_lists
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


@pytest.fixture
def parked(stack) -> Iterator[Callable[[], str]]:
    """Records parked in the delayed set, on a queue no worker consumes: what a line holds."""
    with broker_lists.idle_queue("lines") as queue:

        def one() -> str:
            return add("test.echo", {}, queue=queue, opts=JobOptions(delay=600_000)).job_id

        yield one


@dataclass
class JobType:
    """What admission reads of a task: its name and its declared key limits."""

    name: str
    key_concurrency: KeyConcurrency | None = None
    key_rate: None = None


def ask(
    job_type: JobType, key: str, job_id: str, given: key_limits.Given | None = None
) -> limits.Admission | str:
    """One delivery's admission: what it took, or why not ('held', 'refused')."""
    admission = limits.Admission()
    try:
        key_limits.admit(admission, job_type, {"k": key}, job_id, given or key_limits.Given())
    except limits.LimitReached:
        return "held"
    except key_limits.Superseded:
        return "refused"
    return admission


def line_of(job_type: JobType, key: str, tenant: str | None = None) -> list[str]:
    line = key_limits.KeyNames.of(job_type.name, tenant, key).concurrency[1]
    return [entry.decode() for entry in redis_client().zrange(line, 0, -1)]


def test_a_free_slot_goes_to_the_first_in_line_not_to_whoever_asks(parked):
    job_type, key = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=1)), unique("k")
    a, b, c = parked(), parked(), parked()
    first = ask(job_type, key, a)
    assert isinstance(first, limits.Admission) and len(first.slots) == 1
    assert ask(job_type, key, b) == "held"
    assert ask(job_type, key, c) == "held"
    assert ask(job_type, key, b) == "held"  # asking again keeps its place
    assert line_of(job_type, key) == [b, c]
    limits.release(first)
    # The slot is free and b, first in line, is published at once (woken)
    assert get(b).state == "waiting" and get(c).state == "delayed"
    # c asks first, but b is ahead of it
    assert ask(job_type, key, c) == "held"
    second = ask(job_type, key, b)
    assert isinstance(second, limits.Admission)
    assert line_of(job_type, key) == [c]
    # and another key is not held by this one's line
    assert isinstance(ask(job_type, unique("k"), parked()), limits.Admission)
    limits.release(second)
    assert isinstance(ask(job_type, key, c), limits.Admission)


def test_a_job_that_left_the_line_does_not_hold_it(parked):
    job_type, key = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=1)), unique("k")
    a, b, c = parked(), parked(), parked()
    running = ask(job_type, key, a)
    assert isinstance(running, limits.Admission)
    assert [ask(job_type, key, j) for j in (b, c)] == ["held", "held"]
    # When the first in line is cancelled while it waits, then the running job ends
    cancel(b, None)
    limits.release(running)
    # Then the line skips it: c is published and takes the slot
    assert line_of(job_type, key) == [c]
    assert get(c).state == "waiting"
    assert isinstance(ask(job_type, key, c), limits.Admission)


def test_max_running_slots_and_no_key_no_limit(parked):
    job_type, key = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=2)), unique("k")
    assert all(isinstance(ask(job_type, key, parked()), limits.Admission) for _ in range(2))
    assert ask(job_type, key, parked()) == "held"
    no_key = limits.Admission()
    key_limits.admit(no_key, job_type, {"other": 1}, "d")
    assert no_key.slots == []


def test_cancel_newest_refuses_a_job_while_one_of_its_key_runs(parked):
    job_type = JobType(unique("t.keyed"), KeyConcurrency("k", strategy="cancel_newest"))
    key = unique("k")
    first = ask(job_type, key, "a")
    assert isinstance(first, limits.Admission)
    assert ask(job_type, key, "b") == "refused"
    assert line_of(job_type, key) == []  # no line in this strategy
    limits.release(first)
    assert isinstance(ask(job_type, key, "c"), limits.Admission)


def test_with_two_slots_the_first_two_in_line_may_run(parked):
    job_type, key = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=2)), unique("k")
    a, b, c, d = parked(), parked(), parked(), parked()
    first = [ask(job_type, key, j) for j in (a, b)]
    assert all(isinstance(taken, limits.Admission) for taken in first)
    assert [ask(job_type, key, j) for j in (c, d)] == ["held", "held"]
    for taken in first:
        assert isinstance(taken, limits.Admission)
        limits.release(taken)
    # Both slots are free: d, second in line, may take one before c asks
    assert isinstance(ask(job_type, key, d), limits.Admission)
    assert isinstance(ask(job_type, key, c), limits.Admission)


def test_cancel_in_progress_goes_by_age_not_by_who_asks_first(parked):
    job_type = JobType(unique("t.keyed"), KeyConcurrency("k", strategy="cancel_in_progress"))
    key = unique("k")
    older, newer = parked(), parked()
    running = ask(job_type, key, newer)
    assert isinstance(running, limits.Admission)
    # An older job of the key asks later (a retry, a late delivery): it is the one cancelled
    assert ask(job_type, key, older) == "refused"
    # and a second delivery of the running job does not supersede its own run
    assert ask(job_type, key, newer) == "held"
    assert get(newer).state == "delayed" and get(newer).abort_requested_at is None


def test_a_key_is_its_tenant_s(parked):
    job_type, key = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=1)), unique("k")
    acme, globex = (
        key_limits.Given(tenant=unique("acme")),
        key_limits.Given(tenant=unique("globex")),
    )
    # Two tenants' jobs with the same key each take a slot of their own
    first = ask(job_type, key, parked(), acme)
    assert isinstance(first, limits.Admission)
    assert isinstance(ask(job_type, key, parked(), globex), limits.Admission)
    # a system job's key is neither's
    assert isinstance(ask(job_type, key, parked()), limits.Admission)
    # while the tenant's own next job waits in its tenant's line only
    waiting = parked()
    assert ask(job_type, key, waiting, acme) == "held"
    assert line_of(job_type, key, acme.tenant) == [waiting]
    assert line_of(job_type, key, globex.tenant) == [] and line_of(job_type, key) == []
    limits.release(first)
    assert get(waiting).state == "waiting"  # woken from its tenant's line


def test_a_tenant_s_newest_job_supersedes_none_of_another_tenant_s(parked):
    job_type = JobType(unique("t.keyed"), KeyConcurrency("k", strategy="cancel_in_progress"))
    key = unique("k")
    acme, globex = (
        key_limits.Given(tenant=unique("acme")),
        key_limits.Given(tenant=unique("globex")),
    )
    older, newer = parked(), parked()
    assert isinstance(ask(job_type, key, older, acme), limits.Admission)
    assert isinstance(ask(job_type, key, newer, globex), limits.Admission)
    assert get(older).state == "delayed"  # not cancelled by the other tenant's newer job


def test_a_call_s_key_limits_a_type_that_declares_none(parked):
    job_type, key = JobType(unique("t.plain")), unique("k")
    by_call = key_limits.Given(concurrency_key=key)
    # One job of the call's key at a time, in line, whatever the data says
    first = ask(job_type, "data-key-1", parked(), by_call)
    assert isinstance(first, limits.Admission) and len(first.slots) == 1
    waiting = parked()
    assert ask(job_type, "data-key-2", waiting, by_call) == "held"
    assert line_of(job_type, key) == [waiting]
    # without a call's key, such a type is not limited
    unlimited = ask(job_type, key, parked())
    assert isinstance(unlimited, limits.Admission) and unlimited.slots == []
    limits.release(first)
    assert get(waiting).state == "waiting"


def test_a_call_s_key_replaces_the_one_the_data_gives(parked):
    job_type = JobType(unique("t.keyed"), KeyConcurrency("k", max_running=1))
    data_key, call_key = unique("k"), unique("k")
    assert isinstance(ask(job_type, data_key, parked()), limits.Admission)
    # the data's key is full, but this job's call named another key
    given = key_limits.Given(concurrency_key=call_key)
    assert isinstance(ask(job_type, data_key, parked(), given), limits.Admission)
    assert ask(job_type, data_key, parked(), given) == "held"
