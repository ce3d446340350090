"""Scenario 6: every endpoint x two tenants (BOLA matrix).

Pass figure: 0 cross-tenant (or cross-user) reads or writes, and a foreign id
answers exactly like a missing one: same status, same body.

The endpoints come from the served OpenAPI document, so a new endpoint is in
the matrix the day it is added. Real objects are created as tenant A's
operator alice: a report job and a campaign (owned by tenant + user) and a
job scheduler (owned by the tenant). Then every method is tried on them by
intruders:

- tenant B's operator ``alice`` (same user id, other tenant), for every
  object — the role is held, so no 403 hides the ownership check;
- tenant A's ``bob`` without a role (same tenant, other user), for
  user-owned objects on the operations any user may call. (An operator of
  tenant A may act on every object of tenant A: ``test_tenant_safety``.)

"Unchanged" is read from the database after each foreign attempt; the owner's
own attempt afterwards must differ from a missing id's (the object was really
there, so the matrix is not vacuous).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.intake import pauses
from tasks.jobs.intake import webhooks as webhook_endpoints
from tasks.jobs.intake.enqueue import new_job_id
from tasks.jobs.model import webhooks
from tasks.jobs.model.models import (
    BulkAction,
    JobRecord,
    JobSchedulerRecord,
    RetryAudit,
    WebhookEndpoint,
)
from tasks.jobs.observe.queries import describe, get
from tasks.platform.db import transaction
from tests.security.conftest import DocumentedOperation, documented_operations, record_figure
from tests.support import jobs as _test_jobs  # noqa: F401  (the pausable queue)
from tests.support.client import bearer, unique
from web.api import OPERATIONS as API_OPERATIONS

pytestmark = pytest.mark.usefixtures("stack", "worker")  # a worker: GET /readyz is 200

TENANT_A = unique("tenant-a")
TENANT_B = unique("tenant-b")
OWNER = bearer(tenant=TENANT_A, user="alice", roles=("operator",))
INTRUDERS = {
    "other tenant": bearer(tenant=TENANT_B, user="alice", roles=("operator",)),
    "other user": bearer(tenant=TENANT_A, user="bob"),
}
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
CHECKED: list[str] = []


def in_a_month() -> str:
    return (datetime.now(UTC) + timedelta(days=30)).isoformat()


# A valid body for every request schema in the document. A new one fails the
# matrix with a message saying to add it here.
VALID_BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "CreateReport": lambda: {"reportId": unique(), "rows": 5},
    "ScheduleReport": lambda: {"reportId": unique(), "rows": 5, "runAt": in_a_month()},
    "RetryJob": lambda: {"reason": "security matrix: retry by whoever asks"},
    "UpsertScheduler": lambda: {
        "pattern": "0 0 1 1 *",
        "template": {"name": "report.generate", "data": {"reportId": "yearly", "rows": 10}},
    },
    "CreateCampaign": lambda: {
        "name": "bola",
        "category": "security",
        "template": "hi {name}",
        "recipientCount": 1,
    },
    "SubmitJob": lambda: {"name": "test.echo", "data": {"from": "the matrix"}},
    "UpdateJobData": lambda: {
        "data": {"reportId": unique(), "rows": 7},
        "reason": "security matrix: edited by whoever asks",
    },
    "ChangeDelay": lambda: {"delay": 3_600_000},
    "BulkRequest": lambda: {
        "action": "cancel",
        "filter": {"queue": "bola-quiet", "states": ["delayed"]},
        "reason": "security matrix: bulk by whoever asks",
    },
    # port 9 (discard) on this machine: a delivery there fails at once, and harms no one
    "RegisterWebhook": lambda: {"url": "http://127.0.0.1:9/bola", "events": ["job.completed"]},
    "SetQueueLimits": lambda: {"concurrency": 2, "reason": "security matrix: by whoever asks"},
    "SetKeyLimit": lambda: {
        "key": "partner-*",
        "maxRunning": 2,
        "reason": "security matrix: by whoever asks",
    },
}


def body_for(op: DocumentedOperation) -> dict[str, Any] | None:
    if op.body_schema is None:
        return None
    if op.body_schema not in VALID_BODIES:
        pytest.fail(f"{op.label}: add a valid {op.body_schema} body to VALID_BODIES")
    return VALID_BODIES[op.body_schema]()


def _created(response, key: str) -> str:
    assert response.status_code in (200, 202), response.get_data(as_text=True)
    return response.get_json()[key]


def create_report_job(client) -> str:
    """A delayed report job: nothing (no worker, no promoter) changes it during the test."""
    response = client.post(
        "/api/v1/reports/scheduled", json=VALID_BODIES["ScheduleReport"](), headers=OWNER
    )
    return _created(response, "jobId")


def create_scheduler(client) -> str:
    scheduler_id = unique("sched")
    response = client.put(
        f"/api/v1/schedulers/{scheduler_id}", json=VALID_BODIES["UpsertScheduler"](), headers=OWNER
    )
    return _created(response, "id")


def create_campaign(client) -> str:
    response = client.post(
        "/api/v1/campaigns", json=VALID_BODIES["CreateCampaign"](), headers=OWNER
    )
    return _created(response, "campaignId")


def create_bulk_action(client) -> str:
    """Tenant A's bulk action (an operator's; it matches none of A's jobs: nothing runs)."""
    response = client.post(
        "/api/v1/bulk-actions", json=VALID_BODIES["BulkRequest"](), headers=OWNER
    )
    return _created(response, "id")


def bulk_fingerprint(bulk_id: str) -> Any:
    with transaction() as session:
        row = session.get(BulkAction, bulk_id)
        return None if row is None else (row.state, row.matched, row.done, row.actor)


def job_fingerprint(job_id: str) -> Any:
    """The record, and the audit rows a retry writes before anything else."""
    job = get(job_id)
    with transaction() as session:
        audits = session.scalar(select(func.count()).where(RetryAudit.job_id == job_id))
    return (describe(job) if job else None), audits


def scheduler_fingerprint(scheduler_id: str) -> Any:
    with transaction() as session:
        record = session.get(JobSchedulerRecord, (TENANT_A, scheduler_id))
        if record is None:
            return None
        return (
            record.spec,
            record.queue,
            record.created_by,
            record.updated_at,
            record.next_run_at,
            record.iteration_count,
        )


def campaign_fingerprint(campaign_id: str) -> Any:
    """What a resume writes: finalize jobs of its own (the plan's are ``:plan-N``) and audits."""
    with transaction() as session:
        resumes = session.scalar(
            select(func.count()).where(
                JobRecord.id.like(f"campaign.finalize:{campaign_id}:%"),
                JobRecord.id.not_like("%:plan-%"),
            )
        )
        audits = session.scalar(
            select(func.count()).where(RetryAudit.ids["campaignId"].astext == campaign_id)
        )
    return resumes, audits


def create_webhook(client) -> str:
    response = client.post(
        "/api/v1/webhooks", json=VALID_BODIES["RegisterWebhook"](), headers=OWNER
    )
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()["id"]


def webhook_fingerprint(endpoint_id: str) -> Any:
    with transaction() as session:
        row = session.get(WebhookEndpoint, endpoint_id)
        return None if row is None else (row.tenant_id, row.url, row.events, row.secret)


def create_delivery(client) -> str:
    """A delivery job of tenant A's endpoint, due in a month (no worker sends it meanwhile)."""
    endpoint_id = create_webhook(client)
    data = {"endpointId": endpoint_id, "event": {"id": "bola", "type": "job.completed"}}
    opts = JobOptions(delay=30 * 86_400_000)
    owner = Owner(TENANT_A, "alice")
    return add(webhooks.DELIVER, data, queue=webhooks.QUEUE, opts=opts, owner=owner).job_id


def delivery_fingerprint(job_id: str) -> Any:
    """The delivery's record, and how many deliveries of its event exist (a resend adds one)."""
    with transaction() as session:
        copies = session.scalar(select(func.count()).where(JobRecord.id.like(f"{job_id}:again:%")))
    return job_fingerprint(job_id), copies


PAUSABLE = "pausable"  # a queue of tests.support.jobs' own (no worker consumes it here)


def pause_queue(client) -> str:
    """Tenant A's pause of its jobs on a queue (the object: the queue's name is everyone's)."""
    response = client.post(f"/api/v1/queues/{PAUSABLE}/pause", headers=OWNER)
    assert response.status_code == 200, response.get_data(as_text=True)
    return PAUSABLE


def pause_fingerprint(queue: str) -> Any:
    # A's own pauses and those of every tenant's jobs (which hold A's too): B may add neither
    return [(p.queue, p.tenant_id, p.paused_by) for p in pauses.paused(TENANT_A)]


def lift_pause(client, headers: dict, queue: str) -> None:
    """What an intruder's pause left: its own, lifted again."""
    client.post(f"/api/v1/queues/{queue}/resume", headers=headers)


@dataclass(frozen=True)
class Kind:
    """What a path parameter names, how to make one, and how to see it was not touched.

    A ``shared`` name (a queue) is no tenant's object: every tenant acts on it in its own
    scope (B's pause of a queue is B's). There the check is that B's request leaves A's
    object as it was and tells nothing of it, and that a name no one uses is a 404;
    ``undo`` takes back what B's request did in its own scope.
    """

    user_owned: bool
    create: Callable[[Any], str]
    missing: Callable[[], str]
    fingerprint: Callable[[str], Any]
    shared: bool = False
    undo: Callable[[Any, dict, str], None] | None = None


KINDS: dict[str, Kind] = {
    "job_id": Kind(True, create_report_job, new_job_id, job_fingerprint),
    "scheduler_id": Kind(False, create_scheduler, lambda: unique("sched"), scheduler_fingerprint),
    "campaign_id": Kind(True, create_campaign, new_job_id, campaign_fingerprint),
    "bulk_id": Kind(False, create_bulk_action, new_job_id, bulk_fingerprint),
    "endpoint_id": Kind(False, create_webhook, lambda: f"wh_{unique('x')}", webhook_fingerprint),
    "delivery_id": Kind(False, create_delivery, new_job_id, delivery_fingerprint),
    "queue": Kind(
        False,
        pause_queue,
        lambda: unique("noqueue"),
        pause_fingerprint,
        shared=True,
        undo=lift_pause,
    ),
}

OPERATIONS = documented_operations()
# System-wide operations are no tenant's objects: a tenant's token is 403 on each, whatever
# it names (test_roles), so they are attacked as collections only.
SYSTEM_WIDE = {f"{op.method.upper()} {op.path}" for op in API_OPERATIONS if not op.tenants}
WITH_IDS = [op for op in OPERATIONS if op.path_params and op.label not in SYSTEM_WIDE]
WITHOUT_IDS = [op for op in OPERATIONS if not op.path_params or op.label in SYSTEM_WIDE]


def matrix() -> list[Any]:
    cases = []
    for op in WITH_IDS:
        [param] = op.path_params
        kind = KINDS.get(param)
        for intruder in INTRUDERS:
            if kind is not None and intruder == "other user" and not kind.user_owned:
                continue  # schedulers belong to the tenant: bob may manage them
            if intruder == "other user" and op.operator_only:
                continue  # bob holds no role: 403 before any lookup (test_roles)
            cases.append(pytest.param(op, intruder, id=f"{op.label} as {intruder}"))
    return cases


def call(client, op: DocumentedOperation, headers: dict, object_id: str | None = None):
    url = op.path
    if object_id is not None:
        url = url.replace("{" + op.path_params[0] + "}", object_id)
    body = body_for(op)
    return client.open(
        url,
        method=op.method.upper(),
        headers=headers,
        query_string=STREAMED_FOR if op.path in STREAMS else None,
        **({"json": body} if body is not None else {}),
    )


# Event streams stay open until ``timeout`` (30 s by default): a few seconds show as much.
STREAMS = {"/api/v1/events", "/api/v1/jobs/{job_id}/events", "/api/v1/reports/jobs/{job_id}/events"}
STREAMED_FOR = {"timeout": "3"}


def _normalized(value: Any, object_id: str | None) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v, object_id) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalized(v, object_id) for v in value]
    if isinstance(value, str):
        if ISO_TIME.match(value):
            return "<time>"
        return value.replace(object_id, "<id>") if object_id else value
    return value


def answer(response, object_id: str | None = None) -> tuple[int, Any]:
    """Status and body, with the id asked for and timestamps blanked (a stream is not read)."""
    if response.mimetype == "text/event-stream":
        response.close()
        return response.status_code, "<event stream>"
    text = response.get_data(as_text=True)
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    return response.status_code, _normalized(body, object_id)


@pytest.fixture(autouse=True)
def no_leftover_schedulers(drop_schedulers_of):
    drop_schedulers_of.extend([TENANT_A, TENANT_B])


@pytest.fixture(autouse=True)
def no_leftover_webhooks():
    """Each test's endpoints go after it: a tenant holds at most 20."""
    yield
    for tenant in (TENANT_A, TENANT_B):
        for endpoint in webhook_endpoints.listed(tenant):
            webhook_endpoints.remove(tenant, endpoint.id)


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    by_id = [c for c in CHECKED if " as " in c]
    record_figure(
        "BOLA matrix",
        f"{len(by_id)} (operation, intruder) pairs on {len(WITH_IDS)} id-taking operations + "
        f"{len(CHECKED) - len(by_id)} collection operations, tenant A vs tenant B and "
        f"A's other user; 0 cross-tenant/cross-user reads or writes",
    )


@pytest.mark.parametrize("op,intruder", matrix())
def test_a_foreign_object_answers_exactly_like_a_missing_one(client, op, intruder):
    [param] = op.path_params
    kind = KINDS.get(param)
    if kind is None:
        pytest.fail(f"{op.label}: teach test_bola how to create a {param!r} object (KINDS)")
    headers = INTRUDERS[intruder]
    # Given an object of tenant A's alice
    object_id = kind.create(client)
    before = kind.fingerprint(object_id)
    missing_id = kind.missing()

    # When the intruder tries the operation on it, and on an id that does not exist
    foreign = answer(call(client, op, headers, object_id), object_id)
    missing = answer(call(client, op, headers, missing_id), missing_id)
    if kind.shared:
        # Then the intruder acted in its own scope: A's object as it was, nothing of A's shown
        assert kind.fingerprint(object_id) == before, f"{op.label} as {intruder} changed A's"
        assert foreign[0] < 500 and TENANT_A not in json.dumps(foreign[1]), foreign
        assert missing[0] == 404, missing
        assert kind.undo is not None
        kind.undo(client, headers, object_id)
        CHECKED.append(f"{op.label} as {intruder}")
        return

    # Then both answers are identical, and nothing of A's changed
    assert foreign == missing, f"{op.label} as {intruder}: foreign {foreign} != missing {missing}"
    assert kind.fingerprint(object_id) == before, f"{op.label} as {intruder} changed A's object"
    if op.method != "put":  # an upsert creates the intruder's own object: not a leak
        assert foreign[0] == 404

    # And the owner's same request finds the object (so the check above was not vacuous)
    owner = answer(call(client, op, OWNER, object_id), object_id)
    assert owner != missing or kind.fingerprint(object_id) != before, (
        f"{op.label}: the owner's request looks like a missing object too"
    )
    CHECKED.append(f"{op.label} as {intruder}")


@pytest.mark.parametrize("op", WITHOUT_IDS, ids=lambda op: op.label)
def test_collection_endpoints_show_nothing_of_another_tenant(client, op):
    # Given one object of each kind owned by tenant A (a shared name is no secret: a queue's)
    ids = [kind.create(client) for kind in KINDS.values() if not kind.shared]
    for kind in KINDS.values():
        if kind.shared:
            kind.create(client)
    # When tenant B's operator calls the operation
    response = call(client, op, INTRUDERS["other tenant"])
    # Then no id of A's (nor A's name) is in the answer
    assert response.status_code < 500
    text = response.get_data(as_text=True)
    leaked = [value for value in [*ids, TENANT_A] if value in text]
    assert not leaked, f"{op.label} shows tenant A's {leaked} to tenant B"
    CHECKED.append(op.label)


def test_listing_shows_the_owner_its_own_objects(client):
    # Given a scheduler of tenant A
    scheduler_id = create_scheduler(client)
    # Then A's listing shows it and B's does not (the collection check is not vacuous)
    mine = client.get("/api/v1/schedulers", headers=OWNER).get_json()["schedulers"]
    theirs = client.get("/api/v1/schedulers", headers=INTRUDERS["other tenant"]).get_json()
    assert scheduler_id in [s["id"] for s in mine]
    assert scheduler_id not in [s["id"] for s in theirs["schedulers"]]


def test_the_matrix_covers_every_documented_id_operation():
    """New endpoints are attacked without editing this file: the matrix is the document."""
    served = {op.label for op in documented_operations()}
    in_matrix = {p.values[0].label for p in matrix()} | {op.label for op in WITHOUT_IDS}
    assert served == in_matrix
    assert {p for op in WITH_IDS for p in op.path_params} <= set(KINDS)
