"""``keel jobs list / show / cancel / retry``: the system scope, against the real records."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from keel.cli import main as keel
from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.model.models import JobAction, RetryAudit
from tasks.platform.db import transaction
from tests.support.client import record, unique, wait_state
from tests.support.inline import join

pytestmark = pytest.mark.usefixtures("inline_worker")
DAY_MS = 86_400_000


def jobs(*args: str):
    return CliRunner().invoke(keel, ["jobs", *args])


def lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def later(tenant: str | None, name: str = "test.echo") -> str:
    owner = Owner(tenant, "alice") if tenant else None
    opts = JobOptions(delay=DAY_MS)
    return add(name, {"n": 1}, queue="default", opts=opts, owner=owner).job_id


def test_list_pages_through_a_tenants_jobs_with_filters():
    # Given 3 delayed echo jobs and a sleep job of a tenant, and a system job
    tenant = unique("cli")
    echo = [later(tenant) for _ in range(3)]
    sleeper = later(tenant, "test.sleep")
    system = later(None)
    # When the CLI lists the tenant's echo jobs two at a time
    first = jobs("list", "--tenant", tenant, "--name", "test.echo", "--limit", "2")
    assert first.exit_code == 0, first.output
    cursor = first.stderr.split("--cursor ")[1].strip()
    second = jobs("list", "--tenant", tenant, "--name", "test.echo", "--cursor", cursor)
    # Then the two pages hold the three, newest first, each with its tenant
    listed = lines(first.stdout) + lines(second.stdout)
    assert [j["jobId"] for j in listed] == echo[::-1]
    assert {j["tenantId"] for j in listed} == {tenant}
    assert "--cursor" not in second.stderr
    # And without --tenant the system's jobs are listed too
    everyone = lines(jobs("list", "--state", "delayed", "--limit", "100").stdout)
    assert {system, sleeper} <= {j["jobId"] for j in everyone}


def test_show_and_cancel_any_tenants_job():
    job = later(unique("cli"))
    shown = jobs("show", job)
    assert shown.exit_code == 0 and lines(shown.stdout)[0]["data"] == {"n": 1}
    cancelled = jobs("cancel", job)
    assert cancelled.exit_code == 0, cancelled.output
    assert lines(cancelled.stdout)[0]["state"] == "cancelled"
    assert record(job)["state"] == "cancelled"


def test_cancel_of_an_active_job_aborts_its_run_audited_with_who_and_why():
    job = add("test.cooperative", {"seconds": 30}, queue="default").job_id
    wait_state(job, "active", timeout=30)
    aborted = jobs("cancel", job, "--by", "oncall", "--reason", "runaway import")
    assert aborted.exit_code == 0, aborted.output
    shown = lines(aborted.stdout)[0]  # one JSON line: still active, its abort asked for
    assert shown["state"] == "active" and shown["abortRequestedAt"], shown
    assert wait_state(job, "cancelled", "completed", timeout=10)["state"] == "cancelled"
    with transaction() as session:
        audit = session.execute(
            select(JobAction.actor, JobAction.details).where(JobAction.job_id == job)
        ).all()
    assert [tuple(row) for row in audit] == [
        ("oncall", {"state": "active", "attempt": 1, "reason": "runaway import"})
    ]


def test_a_cancelled_job_is_retried_by_the_cli_only_with_cancelled():
    job = later(unique("cli"))
    jobs("cancel", job)
    why = ["--reason", "the customer asked for it after all", "--by", "oncall"]
    refused = jobs("retry", job, *why)
    assert refused.exit_code == 1 and "retryCancelled" in refused.output
    assert record(job)["state"] == "cancelled"
    asked = jobs("retry", job, *why, "--cancelled")
    assert asked.exit_code == 0, asked.output
    assert wait_state(job, "completed", "failed", timeout=30)["state"] == "completed"


def test_cancel_of_a_finished_or_missing_job_fails_loudly():
    done = add("test.echo", {}, queue="default").job_id
    join([done])
    finished = jobs("cancel", done)
    missing = jobs("cancel", unique("missing"))
    assert finished.exit_code == missing.exit_code == 1
    assert "cannot be cancelled" in finished.output and "not found" in missing.output
    assert record(done)["state"] == "completed"
    assert jobs("show", unique("missing")).exit_code == 1
    assert jobs("list", "--cursor", "not-a-cursor").exit_code == 2


def test_retry_a_failed_job_with_its_audit_row():
    # Given a failed job of a tenant
    job = add("test.always_fails", {}, queue="default", owner=Owner(unique("cli"), "a")).job_id
    join([job])
    # When the CLI retries it, with a too-short reason and then a real one
    short = jobs("retry", job, "--reason", "why", "--by", "ops")
    result = jobs("retry", job, "--reason", "provider fixed their API", "--by", "ops-oncall")
    # Then the short one is refused, the real one audited and run again
    assert short.exit_code == 2
    assert result.exit_code == 0, result.output
    with transaction() as session:
        audits = session.scalars(select(RetryAudit).where(RetryAudit.job_id == job)).all()
    assert [(a.retried_by, a.reason) for a in audits] == [
        ("ops-oncall", "provider fixed their API")
    ]
    assert wait_state(job, "failed", timeout=30)["attemptsStarted"] == 1
    # And retrying a job that is not failed says why
    refused = jobs("retry", later(None), "--reason", "it is not failed at all", "--by", "ops")
    assert refused.exit_code == 1 and "only failed jobs" in refused.output
