"""Scenario 8: a caller without the operator role on every operator endpoint.

Pass figure: 403 on every operator operation, for every non-operator token,
whether the object exists or not (the role is checked before anything is
looked up, so a 403 says nothing about existence), and nothing changes.

Operator operations are read from the served document (those that document
a 403) and must be exactly the ``web.api.OPERATIONS`` entries with
``role="operator"``, and the system-wide ones that no tenant's token reads
(``tenants=False``: the metrics token's): the description and the enforcement
cannot drift apart. A tenant's operator is 403 on those too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from tasks.jobs.model.models import JobRecord, JobSchedulerRecord, RetryAudit
from tasks.platform.db import transaction
from tests.security.conftest import documented_operations, record_figure
from tests.support.client import bearer, unique
from web.api import OPERATIONS

pytestmark = pytest.mark.usefixtures("stack")

TENANT = unique("roles")
OPERATOR = bearer(tenant=TENANT, user="olga", roles=("operator",))
NON_OPERATORS = {
    "no roles": bearer(tenant=TENANT, user="vic", roles=()),
    "another role": bearer(tenant=TENANT, user="vic", roles=("viewer", "reporter")),
    "role in another case": bearer(tenant=TENANT, user="vic", roles=("Operator",)),
    "role as a prefix": bearer(tenant=TENANT, user="vic", roles=("operators",)),
}
DOCUMENTED = documented_operations()
OPERATOR_OPS = [op for op in DOCUMENTED if op.operator_only]
SYSTEM_WIDE = {f"{op.method.upper()} {op.path}" for op in OPERATIONS if not op.tenants}
TENANT_OPERATOR_OPS = [op for op in OPERATOR_OPS if op.label not in SYSTEM_WIDE]
OTHER_OPS = [op for op in DOCUMENTED if op.authenticated and not op.operator_only]
FORBIDDEN: list[str] = []

BODIES = {
    "RetryJob": {"reason": "a viewer would like this re-run"},
    "SubmitJob": {"name": "test.echo", "data": {}},
    "UpsertScheduler": {
        "pattern": "0 0 1 1 *",
        "template": {"name": "report.generate", "data": {"reportId": "yearly", "rows": 10}},
    },
}


@pytest.fixture(scope="module")
def objects(app) -> dict[str, str]:
    """Real objects the non-operator could otherwise reach: their own job and campaign,
    and a scheduler of their tenant."""
    client = app.test_client()
    viewer = NON_OPERATORS["no roles"]
    run_at = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    job = client.post(
        "/api/v1/reports/scheduled",
        headers=viewer,
        json={"reportId": unique(), "rows": 3, "runAt": run_at},
    )
    campaign = client.post(
        "/api/v1/campaigns",
        headers=viewer,
        json={"name": "n", "category": "c", "template": "t", "recipientCount": 1},
    )
    scheduler_id = unique("sched")
    scheduler = client.put(
        f"/api/v1/schedulers/{scheduler_id}", headers=OPERATOR, json=BODIES["UpsertScheduler"]
    )
    assert (job.status_code, campaign.status_code, scheduler.status_code) == (202, 202, 200)
    return {
        "job_id": job.get_json()["jobId"],
        "campaign_id": campaign.get_json()["campaignId"],
        "scheduler_id": scheduler_id,
    }


def footprint(objects: dict[str, str]) -> tuple:
    """Everything an operator operation would write for these objects."""
    with transaction() as session:
        scheduler = session.get(JobSchedulerRecord, (TENANT, objects["scheduler_id"]))
        schedulers = session.scalar(
            select(func.count()).where(JobSchedulerRecord.tenant_id == TENANT)
        )
        audits = session.scalar(select(func.count()).where(RetryAudit.tenant_id == TENANT))
        resumes = session.scalar(
            select(func.count()).where(
                JobRecord.id.like(f"campaign.finalize:{objects['campaign_id']}:%"),
                JobRecord.id.not_like("%:plan-%"),
            )
        )
        state = (scheduler.spec, scheduler.updated_at) if scheduler else None
        return state, schedulers, audits, resumes


def request(client, op, headers: dict, ids: dict[str, str]):
    url = op.path
    for param in op.path_params:
        url = url.replace("{" + param + "}", ids.get(param, unique("id")))
    body = BODIES.get(op.body_schema) if op.body_schema else None
    response = client.open(
        url,
        method=op.method.upper(),
        headers=headers,
        **({"json": body} if body is not None else {}),
    )
    if response.mimetype == "text/event-stream":
        response.close()
    return response


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    record_figure(
        "operator endpoints",
        f"{len(OPERATOR_OPS)} operations x {len(NON_OPERATORS)} non-operator tokens x "
        f"(existing, missing) = {len(FORBIDDEN)} requests, all 403",
    )


@pytest.fixture(autouse=True)
def no_leftover_schedulers(drop_schedulers_of):
    drop_schedulers_of.append(TENANT)


def test_the_document_and_the_code_agree_on_operator_operations():
    enforced = {f"{op.method.upper()} {op.path}" for op in OPERATIONS if op.role == "operator"}
    assert {op.label for op in OPERATOR_OPS} == enforced | SYSTEM_WIDE
    assert len(enforced) >= 8  # 2 retries, queue health, 4 scheduler operations, resume
    assert {"GET /metrics", "GET /api/v1/system/status"} <= SYSTEM_WIDE
    assert all(
        label.split(" ")[1].startswith(("/metrics", "/api/v1/system/")) for label in SYSTEM_WIDE
    )
    assert not enforced & SYSTEM_WIDE


@pytest.mark.parametrize("who", list(NON_OPERATORS))
@pytest.mark.parametrize("op", OPERATOR_OPS, ids=lambda op: op.label)
def test_a_non_operator_is_403_on_every_operator_endpoint(client, objects, op, who):
    headers = NON_OPERATORS[who]
    before = footprint(objects)
    # When a non-operator calls the operation on a real object and on a missing one
    on_real = request(client, op, headers, objects)
    on_missing = request(client, op, headers, {})
    # Then both are the same 403, in the error shape
    for response in (on_real, on_missing):
        assert response.status_code == 403, f"{op.label}: {response.get_data()!r}"
        assert response.get_json()["error"] == "forbidden"
        FORBIDDEN.append(op.label)
    assert on_real.get_json() == on_missing.get_json()
    # And nothing was written
    assert footprint(objects) == before


@pytest.mark.parametrize("op", TENANT_OPERATOR_OPS, ids=lambda op: op.label)
def test_an_operator_is_let_through(client, objects, op):
    """The control: the role check is what said 403, not something else."""
    response = request(client, op, OPERATOR, objects)
    assert response.status_code not in (401, 403), response.get_data()


@pytest.mark.parametrize("op", sorted(SYSTEM_WIDE))
def test_a_tenants_operator_is_403_on_the_system_wide_operations(client, op):
    """System-wide figures are no tenant's: its operator is refused as a viewer is."""
    method, path = op.split(" ", 1)
    response = client.open(path, method=method, headers=OPERATOR)
    assert response.status_code == 403, response.get_data()
    assert response.get_json()["error"] == "forbidden"


@pytest.mark.parametrize("op", OTHER_OPS, ids=lambda op: op.label)
def test_other_endpoints_need_no_role(client, objects, op):
    response = request(client, op, NON_OPERATORS["no roles"], objects)
    assert response.status_code not in (401, 403), response.get_data()
