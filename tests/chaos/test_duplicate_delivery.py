"""Scenario 2: every report message is delivered three times, concurrently.

Why: a broker redelivers (visibility timeout, a restored unacked message, a
republish after a reset, a producer retry), and the copies can reach
different workers at the same moment. The claim must let exactly one run
happen per job, and the artifact store must hold one artifact per key.
"""

from __future__ import annotations

import re
import time

import pytest

from tasks.jobs.intake.messages import Message, publish
from tasks.reports.jobs import GENERATE
from tests.support.chaos import (
    add_reports,
    artifact_rows,
    completed_runs,
    ensure_broker_epoch,
    job_rows,
    settle,
    stragglers,
)
from tests.support.client import unique

COPIES = 3


def handled(workers, job_ids: set[str]) -> int:
    """Deliveries of these jobs the workers finished with (logged ``succeeded`` or ``ignored``)."""
    pattern = re.compile(rf"Task {re.escape(GENERATE)}\[([0-9a-f]+)\] (?:succeeded|ignored)")
    return sum(
        1
        for worker in workers
        for match in pattern.finditer(worker.log_path.read_text(errors="replace"))
        if match.group(1) in job_ids
    )


def deliver_each_three_times(spawn, count: int) -> None:
    # Given two workers of three processes each consuming a dedicated queue,
    queue = unique("chaos-dup")
    workers = [spawn("dup", concurrency=3, queues=queue) for _ in range(2)]
    ensure_broker_epoch()
    # and `count` report jobs recorded on it, not yet published,
    jobs = add_reports(queue, count, publish_now=False)
    data = {job_id: row["data"] for job_id, row in job_rows(list(jobs)).items()}
    # When each job's message is published three times back to back (the copies sit side
    # by side in the queue, so different processes take them at the same moment)
    for job_id in jobs:
        for _ in range(COPIES):
            publish(Message(job_id, GENERATE, queue, data[job_id]))
    # Then every job completes with exactly one run, and one artifact per operation key
    result = settle(jobs, timeout=120)
    assert result.clean, (result.figure(), stragglers(result))
    deadline = time.monotonic() + 60
    while (delivered := handled(workers, set(jobs))) < COPIES * count:
        assert time.monotonic() < deadline, f"only {delivered} deliveries handled"
        time.sleep(0.5)
    result = settle(jobs, timeout=0)  # counted again once every copy was handled
    print(
        f"\nscenario 2 ({count} reports x {COPIES} deliveries): {result.figure()}; "
        f"{delivered} deliveries handled"
    )
    assert result.clean, (result.figure(), stragglers(result))
    rows = job_rows(list(jobs))
    assert [
        job_id
        for job_id, row in rows.items()
        if row["attempts_started"] != 1 or len(row["runs"]) != 1 or completed_runs(row) != 1
    ] == []
    stored = artifact_rows(list(jobs.values()))
    assert {key: owners for key, owners in stored.items() if len(owners) != 1} == {}
    assert all(stored[key] == [job_id] for job_id, key in jobs.items())
    # And every copy really was delivered and handled (the broker did not fold them together)
    assert delivered == COPIES * count


def test_each_report_delivered_three_times_runs_once_and_stores_one_artifact(spawn):
    """200 jobs x 3 concurrent deliveries → 200 runs, 200 artifacts."""
    deliver_each_three_times(spawn, 200)


@pytest.mark.slow
def test_each_of_1000_reports_delivered_three_times_runs_once(spawn):
    """The same at 1,000 jobs, 3,000 deliveries."""
    deliver_each_three_times(spawn, 1000)
