"""A handler that raises ``RateLimited`` (BullMQ's ``RateLimitError``): the job runs again
later without using an attempt, and no job of its key starts until then, on any worker;
other keys go on."""

from __future__ import annotations

import pytest

from tasks.jobs import RateLimited, add
from tests.support.client import ts, unique, wait_state

pytestmark = pytest.mark.usefixtures("inline_worker")


def test_a_rate_limited_key_starts_nothing_until_the_time_its_service_named():
    key, other_key = unique("api"), unique("api")
    limited = add("test.throttled", {"apiKey": key, "throttle": True, "ms": 1500}, queue="default")
    first = wait_state(limited.job_id, "delayed", "completed", timeout=15)
    said_at = ts(first["runs"][0]["finishedAt"])
    # When more jobs of its key, and one of another key, are added meanwhile
    same = [add("test.throttled", {"apiKey": key}, queue="default").job_id for _ in range(3)]
    other = add("test.throttled", {"apiKey": other_key}, queue="default").job_id
    # Then the other key's job runs at once; the key's wait out the 1.5 s
    other_run = wait_state(other, "completed", timeout=15)["runs"][0]
    assert (ts(other_run["startedAt"]) - said_at).total_seconds() < 1.2
    for job_id in same:
        run = wait_state(job_id, "completed", timeout=20)["runs"][-1]
        assert (ts(run["startedAt"]) - said_at).total_seconds() >= 1.4, run
    # and the limited job ran again, its wait costing no attempt
    done = wait_state(limited.job_id, "completed", timeout=20)
    assert [run["outcome"] for run in done["runs"]] == ["deferred", "completed"]
    assert done["attemptsMade"] == 0
    assert (ts(done["runs"][1]["startedAt"]) - said_at).total_seconds() >= 1.4


def test_a_queue_without_a_rate_limit_holds_only_the_job():
    key = unique("api")
    data = {"apiKey": key, "throttle": True, "ms": 3000, "scope": "queue"}
    limited = add("test.throttled", data, queue="default").job_id
    said_at = ts(wait_state(limited, "delayed", timeout=15)["runs"][0]["finishedAt"])
    after = add("test.throttled", {"apiKey": key}, queue="default").job_id
    run = wait_state(after, "completed", timeout=15)["runs"][0]
    assert (ts(run["startedAt"]) - said_at).total_seconds() < 2.5
    assert wait_state(limited, "completed", timeout=20)["attemptsMade"] == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0,), {}, "1 ms to a day"),
        ((86_400_001,), {}, "1 ms to a day"),
        ((10,), {"scope": "tenant"}, "scope"),
    ],
)
def test_a_rate_limit_out_of_range_is_refused(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        RateLimited(*args, **kwargs)
