"""Operators act within their tenant; what leaves Keel never carries another's data or SQL.

- an operator reads and retries any job of its own tenant, never another tenant's;
  a tenant operator's queue health counts only its tenant;
- an operator retry never answers 500, whatever the failed job holds;
- a failed job's reason never quotes SQL or its parameters;
- campaign templates are bounded before anything is rendered, and a worker
  renders a bounded amount of text at a time;
- a weak signing key stops the app, ``keel token`` and ``keel up`` at start,
  and ``keel token`` refuses lifetimes past the maximum.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.intake.enqueue import new_job_id
from tasks.notifications import campaigns
from tasks.notifications.models import Campaign, CampaignRecipient
from tasks.notifications.templates import MAX_TEXT_LENGTH, TEXT_PER_REQUEST
from tasks.platform.db import transaction
from tasks.reports.jobs import GENERATE
from tests.security.conftest import record_figure
from tests.support.client import bearer, unique, wait_state
from web import create_app

pytestmark = pytest.mark.usefixtures("stack")
KEEL = str(Path(sys.executable).with_name("keel"))


def report(client, headers: dict, **extra) -> dict:
    body = {"reportId": unique(), "rows": 5, **extra}
    response = client.post("/api/v1/reports", json=body, headers=headers)
    assert response.status_code == 202, response.get_json()
    return response.get_json()


@pytest.mark.usefixtures("worker")
def test_an_operator_reads_and_retries_its_tenants_jobs_and_nobody_elses(client):
    tenant = unique("team")
    alice, bob = bearer(tenant=tenant, user="alice"), bearer(tenant=tenant, user="bob")
    ops = bearer(tenant=tenant, user="olga", roles=("operator",))
    foreign_ops = bearer(tenant=unique("other"), user="olga", roles=("operator",))
    # Given alice's report that failed for good
    failed = report(client, alice, failUntilAttempt=5)
    wait_state(failed["jobId"], "failed", timeout=60)
    url = failed["statusUrl"]
    # Then her colleague bob cannot see it, her tenant's operator can, another tenant's cannot
    assert client.get(url, headers=bob).status_code == 404
    assert client.get(url, headers=ops).get_json()["state"] == "failed"
    assert client.get(url, headers=foreign_ops).status_code == 404
    # And the tenant's operator may retry it; the other tenant's operator gets a 404
    reason = {"reason": "storage is back, run it again"}
    assert client.post(f"{url}/retry", json=reason, headers=foreign_ops).status_code == 404
    retried = client.post(f"{url}/retry", json=reason, headers=ops)
    assert retried.status_code == 202, retried.get_json()
    # Its events stream likewise opens for the tenant's operator only
    events = client.get(f"{url}/events?timeout=1", headers=ops)
    assert events.status_code == 200
    events.close()
    assert client.get(f"{url}/events?timeout=1", headers=foreign_ops).status_code == 404


def test_queue_health_counts_only_the_operators_tenant(client):
    from datetime import UTC, datetime, timedelta

    mine, theirs = unique("health-a"), unique("health-b")
    run_at = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    for tenant, n in ((mine, 2), (theirs, 3)):
        for _ in range(n):
            body = {"reportId": unique(), "rows": 5, "runAt": run_at}
            response = client.post(
                "/api/v1/reports/scheduled", json=body, headers=bearer(tenant=tenant)
            )
            assert response.status_code == 202
    health = client.get(
        "/api/v1/reports/queue/health", headers=bearer(tenant=mine, roles=("operator",))
    ).get_json()
    assert health == {"waiting": 0, "active": 0, "delayed": 2, "completed": 0, "failed": 0}


@pytest.mark.usefixtures("worker")
def test_an_operator_retry_of_a_job_with_unexpected_data_is_not_a_500(client):
    # Given a report job of the tenant that failed on data it could not use
    tenant = unique("odd")
    job = add(
        GENERATE,
        {"rows": "many"},
        queue="reports",
        owner=Owner(tenant, "alice"),
        opts=JobOptions(attempts=1),
    ).job_id
    assert "rows" in wait_state(job, "failed")["failedReason"]
    # When the tenant's operator retries it
    response = client.post(
        f"/api/v1/reports/jobs/{job}/retry",
        json={"reason": "retrying odd data on purpose"},
        headers=bearer(tenant=tenant, user="olga", roles=("operator",)),
    )
    # Then it is accepted (and fails again, visibly), not a 500
    assert response.status_code == 202, response.get_json()


@pytest.mark.usefixtures("worker")
def test_a_failure_reason_never_quotes_sql_or_its_parameters(client):
    job = add("test.db_error", {}, queue="default", owner=Owner(unique("t"), "u")).job_id
    reason = wait_state(job, "failed")["failedReason"]
    assert reason.startswith("database error (")
    for leak in ("SELECT", "[SQL", "secret-value-xyz", "parameters"):
        assert leak not in reason, reason


@pytest.mark.usefixtures("sandbox")
def test_a_template_that_renders_past_the_providers_limit_is_400(client):
    # The review's request: "{a}" x 666 and one 300 KB value — 200 MB per message
    huge = {
        "name": "n",
        "category": "c",
        "template": "{a}" * 666,
        "recipients": [{"to": "+82-10-1", "vars": {"a": "x" * 300_000}}],
    }
    response = client.post("/api/v1/campaigns", json=huge, headers=bearer())
    assert response.status_code == 400, response.get_json()
    [detail] = response.get_json()["details"]
    assert detail["limit"] == "maxMessageLength" and detail["longest"] == 666 * 300_000
    # A message of exactly the provider's limit is accepted
    fits = {
        "name": "n",
        "category": "c",
        "template": "{a}{b}",
        "recipients": [
            {"to": "+82-10-1", "vars": {"a": "x" * (MAX_TEXT_LENGTH - 1)}},
            {"to": "+82-10-2", "vars": {"a": "x", "b": 12345}},
        ],
    }
    assert client.post("/api/v1/campaigns", json=fits, headers=bearer()).status_code == 202
    fits["recipients"][1]["vars"]["b"] = "y" * MAX_TEXT_LENGTH
    assert client.post("/api/v1/campaigns", json=fits, headers=bearer()).status_code == 400


def stored_campaign(recipients: int, value_chars: int) -> Campaign:
    """A campaign written straight to the records (no plan job: nothing sends it)."""
    campaign = Campaign(
        id=new_job_id(),
        tenant_id=unique("mem"),
        user_id="u",
        name="m",
        category="c",
        template="{a}" * 600,
        recipient_count=recipients,
        synthetic=False,
        chunk_size=recipients,
        chunk_count=1,
        capacity=10_000,
        current_generation=0,
    )
    with transaction() as session:
        session.add(campaign)
        session.flush()
        session.bulk_insert_mappings(
            CampaignRecipient,
            [
                {"campaign_id": campaign.id, "seq": i, "to": f"+82-{i}", "vars": {"a": "y" * 15}}
                for i in range(recipients)
            ],
        )
    return campaign


def test_a_worker_renders_a_bounded_amount_of_text_at_a_time():
    # Given 2,000 recipients whose messages are 9,000 characters each (18 MB in all)
    campaign = stored_campaign(2000, 15)
    # When the chunk's provider requests are built and serialised one after another
    tracemalloc.start()
    sent, largest = 0, 0
    for batch in campaigns.message_batches(campaign, 0):
        body = json.dumps({"messages": batch})
        sent += len(batch)
        largest = max(largest, sum(len(m["text"]) for m in batch))
        del body
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # Then every message went out, no request held more than ~1 MB of text,
    # and the peak of Python memory stayed a small fraction of the 18 MB rendered
    assert sent == 2000
    assert largest <= TEXT_PER_REQUEST
    assert peak < 8_000_000, f"peak {peak / 1e6:.1f} MB"
    record_figure(
        "chunk rendering",
        f"18 MB of messages in requests of <= {largest} chars; "
        f"peak Python memory {peak / 1e6:.1f} MB",
    )


def test_a_weak_signing_key_stops_the_app_the_cli_and_keel_up(tmp_path):
    with pytest.raises(RuntimeError, match="at least 32"):
        create_app({"TESTING": True, "SECRET_KEY": "a"})
    env = {**os.environ, "KEEL_SECRET_KEY": "a", "KEEL_HOME": str(tmp_path)}
    for args in (["token", "--tenant", "acme", "--user", "alice"], ["up"]):
        result = subprocess.run([KEEL, *args], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "at least 32" in result.stderr, (args, result.stderr)
    assert not (tmp_path / "pg").exists()  # keel up refused before starting anything


def test_keel_token_refuses_a_lifetime_past_the_maximum():
    result = subprocess.run(
        [KEEL, "token", "--tenant", "acme", "--user", "alice", "--ttl", str(10 * 366 * 86_400)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "--ttl" in result.stderr
    fine = subprocess.run(
        [KEEL, "token", "--tenant", "acme", "--user", "alice", "--ttl", "60"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fine.returncode == 0 and fine.stdout.count(".") == 2
