"""A tenant's job schedulers: judged at upsert like API calls, and they work end to end.

Pass figures: every template a tenant may not schedule (system jobs, Celery's
own tasks, unknown names, foreign queues, identity in data, data the job would
refuse) is 400 at upsert through the API and the CLI, with nothing recorded and
no other tenant's artifact touched; a report scheduler made the way a user
would make it fires jobs owned by its tenant and user that complete, with one
artifact owned by that tenant.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from keel.cli import main as keel
from tasks.jobs.model.models import JobRecord, JobSchedulerRecord
from tasks.jobs.schedule.schedulers import fire_job_id, fire_prefix
from tasks.platform.db import transaction
from tasks.reports.models import ReportArtifact
from tasks.reports.operation_key import operation_key
from tests.security.conftest import record_figure
from tests.support.client import bearer, unique, wait_state
from tests.support.stack import BeatProcess, wait_for

pytestmark = pytest.mark.usefixtures("stack")

TENANT = unique("sched-t")
OPERATOR = bearer(tenant=TENANT, user="olga", roles=("operator",))
REFUSED: list[str] = []

# (what, template, queue) — each must be refused at upsert, for a tenant.
FORBIDDEN = {
    "the artifact cleanup (a system job)": (
        {"name": "reports.cleanup", "data": {"keepDays": 0}},
        None,
    ),
    "the campaign monitor (a system job)": (
        {"name": "campaign.monitor", "data": {"quietSeconds": 0.001}},
        None,
    ),
    "a Celery built-in": ({"name": "celery.backend_cleanup"}, None),
    "an unknown job name": ({"name": "security.noop"}, None),
    "a report on Celery's default queue": (
        {"name": "report.generate", "data": {"reportId": "r", "rows": 5}},
        "celery",
    ),
    "a report naming another tenant": (
        {"name": "report.generate", "data": {"reportId": "r", "rows": 5, "tenantId": "victim"}},
        None,
    ),
    "a report naming another user": (
        {"name": "report.generate", "data": {"reportId": "r", "rows": 5, "requestedBy": "victim"}},
        None,
    ),
    "a report with zero rows": (
        {"name": "report.generate", "data": {"reportId": "r", "rows": 0}},
        None,
    ),
    "a report without rows": ({"name": "report.generate", "data": {"reportId": "r"}}, None),
}


def schedulers_of(tenant: str) -> int:
    with transaction() as session:
        return (
            session.scalar(select(func.count()).where(JobSchedulerRecord.tenant_id == tenant)) or 0
        )


def cli(*args: str):
    return CliRunner().invoke(keel, ["schedulers", "upsert", *args])


@pytest.fixture(autouse=True)
def no_leftover_schedulers(drop_schedulers_of):
    drop_schedulers_of.append(TENANT)


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    record_figure(
        "scheduler templates refused at upsert (API + CLI)", f"{len(REFUSED)} refused, 0 recorded"
    )


@pytest.mark.parametrize("what", list(FORBIDDEN))
def test_a_template_a_tenant_may_not_schedule_is_400_at_upsert(client, what):
    template, queue = FORBIDDEN[what]
    body = {"every": 1000, "template": template, **({"queue": queue} if queue else {})}
    # When a tenant's operator upserts it through the API
    response = client.put(f"/api/v1/schedulers/{unique('s')}", json=body, headers=OPERATOR)
    # Then 400 in the error shape, naming the problem, and nothing is recorded
    assert response.status_code == 400, response.get_json()
    error = response.get_json()
    assert error["error"] == "validation_failed" and error["details"], error
    # And through the CLI, for the same tenant: refused as well
    args = [
        "--every",
        "1000",
        "--name",
        template["name"],
        "--data",
        json.dumps(template.get("data", {})),
        "--tenant",
        TENANT,
        "--user",
        "olga",
    ]
    result = cli(unique("s"), *args, *(["--queue", queue] if queue else []))
    assert result.exit_code != 0 and "refused" in result.output, result.output
    assert schedulers_of(TENANT) == 0
    REFUSED.extend([f"API {what}", f"CLI {what}"])


def test_system_scope_may_still_schedule_system_jobs():
    """The CLI's system scope is where retention and monitoring belong."""
    scheduler_id = unique("sys")
    result = cli(
        scheduler_id,
        "--pattern",
        "0 0 1 1 *",
        "--name",
        "reports.cleanup",
        "--data",
        '{"keepDays": 30}',
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["queue"] == "reports"
    assert CliRunner().invoke(keel, ["schedulers", "remove", scheduler_id]).exit_code == 0


def test_cli_tenant_needs_a_user_and_valid_ids():
    base = [
        "--every",
        "1000",
        "--name",
        "report.generate",
        "--data",
        '{"reportId": "r", "rows": 5}',
    ]
    assert cli(unique("s"), *base, "--tenant", TENANT).exit_code != 0
    assert cli(unique("s"), *base, "--tenant", "../x", "--user", "u").exit_code != 0
    assert cli(unique("s"), *base, "--data", "not json").exit_code != 0
    assert schedulers_of(TENANT) == 0


@pytest.fixture(scope="module")
def beat(stack):
    process = BeatProcess(stack.home, unique("tenant-beat"))
    process.start()
    yield process
    process.stop()


def fired(tenant: str, scheduler_id: str) -> list[JobRecord]:
    with transaction() as session:
        return list(
            session.scalars(
                select(JobRecord).where(JobRecord.id.startswith(fire_prefix(tenant, scheduler_id)))
            )
        )


def assert_report_scheduler_works(tenant: str, user: str, scheduler_id: str, report_id: str):
    # Then it fires 3 jobs, owned by the scheduler's tenant and user, all completed
    wait_for(lambda: len(fired(tenant, scheduler_id)) >= 3, timeout=20)
    jobs = fired(tenant, scheduler_id)
    assert len(jobs) == 3
    done = [wait_state(job.id, "completed", timeout=30) for job in jobs]
    assert {(job.tenant_id, job.user_id) for job in jobs} == {(tenant, user)}
    assert all(job.data == {"reportId": report_id, "rows": 5} for job in jobs)
    # And one artifact, owned by that tenant, reused by the later runs
    key = operation_key(tenant, user, report_id, 5)
    with transaction() as session:
        stored = session.scalars(
            select(ReportArtifact).where(ReportArtifact.operation_key == key)
        ).all()
    assert [(a.tenant_id, a.object_key) for a in stored] == [
        (tenant, f"reports/{tenant}/{key}.csv")
    ]
    assert sorted(d["result"]["reused"] for d in done) == [False, True, True]


@pytest.mark.usefixtures("worker", "beat")
def test_a_report_scheduler_made_through_the_api_fires_the_tenants_reports(client):
    # Given a report scheduler made the way a user would, through the API
    scheduler_id, report_id = unique("nightly"), unique("q")
    body = {
        "every": 1000,
        "limit": 3,
        "template": {"name": "report.generate", "data": {"reportId": report_id, "rows": 5}},
    }
    response = client.put(f"/api/v1/schedulers/{scheduler_id}", json=body, headers=OPERATOR)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["queue"] == "reports"
    assert_report_scheduler_works(TENANT, "olga", scheduler_id, report_id)


@pytest.mark.usefixtures("worker", "beat")
def test_a_report_scheduler_made_through_the_cli_fires_the_tenants_reports():
    scheduler_id, report_id = unique("cli-nightly"), unique("q")
    result = cli(
        scheduler_id,
        "--every",
        "1000",
        "--limit",
        "3",
        "--name",
        "report.generate",
        "--data",
        json.dumps({"reportId": report_id, "rows": 5}),
        "--tenant",
        TENANT,
        "--user",
        "carl",
    )
    assert result.exit_code == 0, result.output
    assert_report_scheduler_works(TENANT, "carl", scheduler_id, report_id)


def test_fire_ids_of_different_tenants_and_schedulers_never_collide():
    """``X`` + ``ops:nightly`` and ``X:ops`` + ``nightly`` joined with ":" would be one id."""
    from datetime import UTC, datetime

    at = datetime(2026, 12, 1, tzinfo=UTC)
    pairs = [("X", "ops:nightly"), ("X:ops", "nightly"), ("", "X:ops:nightly"), ("X", "ops")]
    ids = {fire_job_id(tenant, scheduler, at) for tenant, scheduler in pairs}
    assert len(ids) == len(pairs)
    long_one = fire_job_id("t" * 64, "s" * 200, at)
    assert len(long_one) <= 200  # fits the job id column whatever the parts' lengths
