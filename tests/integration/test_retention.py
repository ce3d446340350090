"""removeOnComplete / removeOnFail: lazy trimming, and the failure archive."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from tasks.jobs import Backoff, JobOptions, add
from tasks.jobs.model.models import ArchivedJob, JobRecord
from tasks.platform.db import transaction
from tasks.reports.service import report_options
from tests.support.client import bearer, unique
from tests.support.stack import wait_for

pytestmark = pytest.mark.usefixtures("inline_worker")


def count(queue: str, state: str, *, tenant: str | None = None, name: str | None = None) -> int:
    """Records of ``queue`` in ``state`` (of one tenant, or of one system job name)."""
    where = [JobRecord.queue == queue, JobRecord.state == state]
    if tenant is not None:
        where.append(JobRecord.tenant_id == tenant)
    if name is not None:
        where.append(JobRecord.name == name)
    with transaction() as session:
        return session.scalar(select(func.count()).where(*where))


def test_report_jobs_keep_the_newest_hundred_of_each_kind():
    opts = report_options("k")
    assert (opts.remove_on_complete, opts.remove_on_fail) == (100, 100)


def all_finished(job_ids: list[str]) -> bool:
    """Every one of these jobs completed or failed (or was already trimmed)."""
    with transaction() as session:
        live = session.scalar(
            select(func.count()).where(
                JobRecord.id.in_(job_ids), JobRecord.state.not_in(("completed", "failed"))
            )
        )
    return live == 0


def unfinished(queue: str) -> int:
    return sum(count(queue, state) for state in ("waiting", "active", "delayed"))


def test_250_completed_reports_leave_at_most_100_records(client):
    urls, ids = [], []
    for _ in range(250):
        response = client.post(
            "/api/v1/reports", json={"reportId": unique(), "rows": 1}, headers=bearer()
        )
        urls.append(response.get_json()["statusUrl"])
        ids.append(response.get_json()["jobId"])
    wait_for(lambda: all_finished(ids), timeout=120, interval=0.5)
    # trimming follows each completion's commit: the last ones' trims may still be running
    wait_for(lambda: count("reports", "completed", tenant="acme") <= 100, timeout=30)
    # the oldest was trimmed: 404, exactly like a job that never existed
    assert client.get(urls[0], headers=bearer()).status_code == 404
    assert client.get(urls[-1], headers=bearer()).get_json()["state"] == "completed"


def test_trimmed_failed_records_are_archived():
    opts = JobOptions(attempts=1, remove_on_fail=5, backoff=Backoff(delay=0))
    jobs = [
        add("test.always_fails", {"i": i}, queue="default", opts=opts).job_id for i in range(15)
    ]
    wait_for(lambda: all_finished(jobs), timeout=60)

    def archived() -> list[ArchivedJob]:
        with transaction() as session:
            return list(session.scalars(select(ArchivedJob).where(ArchivedJob.id.in_(jobs))))

    # Trimming follows each failure's commit: the last failures' trims may still be running
    # when the records are all finished.
    wait_for(
        lambda: count("default", "failed", name="test.always_fails") <= 5 and len(archived()) >= 10,
        timeout=30,
    )
    assert all(a.failed_reason.startswith("plain failure") for a in archived())
