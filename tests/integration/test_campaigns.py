"""Notification group sends, checked against the provider sandbox's own ledger."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tasks.notifications.verify import verify
from tasks.platform.db import transaction
from tests.support.client import bearer, wait_state
from tests.support.stack import WorkerProcess, sandbox_admin_headers, wait_for

pytestmark = pytest.mark.usefixtures("worker", "sandbox")
URL = "/api/v1/campaigns"
OPERATOR = bearer(roles=("operator",))


def start(client, **body) -> str:
    payload = {"name": "winter sale", "category": "marketing", "template": "Hi {name}!", **body}
    response = client.post(URL, json=payload, headers=OPERATOR)
    assert response.status_code == 202, response.get_json()
    return response.get_json()["campaignId"]


def finished(client, campaign_id: str, timeout: float = 120) -> dict:
    def done() -> dict | None:
        status = client.get(f"{URL}/{campaign_id}", headers=OPERATOR).get_json()
        return status if status["state"] == "completed" else None

    try:
        return wait_for(done, timeout=timeout, interval=0.5)
    except AssertionError:
        print(json.dumps(client.get(f"{URL}/{campaign_id}", headers=OPERATOR).get_json()))
        print(json.dumps(unfinished_jobs(campaign_id), default=str))
        raise


def unfinished_jobs(campaign_id: str) -> list[dict]:
    """The campaign's jobs that are not completed: what a stuck run is waiting on."""
    from sqlalchemy import text

    with transaction() as session:
        rows = (
            session.execute(
                text(
                    "SELECT id, state, attempts_made, attempts_started, stalled_count, "
                    "failed_reason "
                    "FROM jobs WHERE queue = 'notifications' AND state <> 'completed' "
                    "AND data->>'campaignId' = :c"
                ),
                {"c": campaign_id},
            )
            .mappings()
            .all()
        )
    return [dict(r) for r in rows]


def assert_invariants(campaign_id: str) -> list:
    checks = verify(campaign_id)
    for check in checks:
        print("PASS" if check.ok else "FAIL", check.name, json.dumps(check.figures))
    assert all(check.ok for check in checks), [c.name for c in checks if not c.ok]
    return checks


def test_a_listed_campaign_is_sent_once_in_one_group(client, sandbox):
    # Given 250 listed recipients in chunks of 100 (the smallest chunk a tenant may ask for)
    recipients = [{"to": f"+82-10-0000-{n:04d}", "vars": {"name": f"user{n}"}} for n in range(250)]
    campaign_id = start(client, recipients=recipients, chunkSize=100)
    # When it runs
    status = finished(client, campaign_id)
    # Then one generation, one group, every chunk loaded, sent once, reported once
    assert status["chunks"] == {"planned": 3, "assigned": 3, "loaded": 3}
    [generation] = status["generations"]
    assert generation["sent"] and generation["messages"] == 250
    assert status["report"]["messages"] == 250 and status["stalled"] is False
    assert_invariants(campaign_id)
    # And the chord's callback ran (it may find the work already done: it is idempotent)
    finalize = wait_state(f"campaign.finalize:{campaign_id}:plan-1", "completed")
    assert finalize["result"]["finalized"] is True


def test_100k_recipients_roll_over_ten_generations(client, sandbox):
    started = time.monotonic()
    campaign_id = start(client, recipientCount=100_000, chunkSize=5_000)
    status = finished(client, campaign_id, timeout=240)
    assert len(status["generations"]) == 10
    assert all(g["sent"] and g["messages"] == 10_000 for g in status["generations"])
    checks = assert_invariants(campaign_id)
    assert checks[2].figures["landed"] == 100_000
    # Each generation's group creator was queued before any chunk joined it (prepared
    # ahead, before the generation two back closed): no chunk had to add it, however many
    # chunks ran at once (whether its group was made by then is timing)
    assert creators_queued_before_first_assignment(campaign_id) == [True] * 10
    print(f"100k campaign: {time.monotonic() - started:.1f}s")


def creators_queued_before_first_assignment(campaign_id: str) -> list[bool]:
    """Per generation: was its ``group.create`` job recorded before its first chunk's assignment?"""
    from sqlalchemy import text

    with transaction() as session:
        rows = session.execute(
            text(
                """
                SELECT k.generation, min(k.assigned_at) > j.created_at AS ahead
                FROM campaign_chunks k
                JOIN jobs j ON j.id = 'group.create:' || k.campaign_id || ':' || k.generation
                WHERE k.campaign_id = :c GROUP BY k.generation, j.created_at
                ORDER BY k.generation
                """
            ),
            {"c": campaign_id},
        ).all()
    return [row.ahead for row in rows]


def test_campaigns_are_tenant_scoped_and_validated(client):
    campaign_id = start(client, recipientCount=5)
    assert client.get(f"{URL}/{campaign_id}", headers=bearer(tenant="globex")).status_code == 404
    assert client.get(f"{URL}/{campaign_id}", headers=bearer(user="bob")).status_code == 404
    assert client.post(f"{URL}/{campaign_id}/resume", headers=bearer()).status_code == 403
    too_many = [{"to": "x"}] * 10_001
    response = client.post(
        URL,
        headers=OPERATOR,
        json={"name": "n", "category": "c", "template": "t", "recipients": too_many},
    )
    assert response.status_code == 400
    assert "10000" in str(response.get_json()["details"])
    both = client.post(
        URL,
        headers=OPERATOR,
        json={
            "name": "n",
            "category": "c",
            "template": "t",
            "recipientCount": 3,
            "recipients": [{"to": "x"}],
        },
    )
    assert both.status_code == 400


def faults(sandbox, **settings) -> None:
    response = requests.put(
        f"{sandbox.url}/admin/faults", json=settings, headers=sandbox_admin_headers(), timeout=5
    )
    assert response.status_code == 200, response.text


def chunk_jobs(campaign_id: str, count: int) -> list[tuple[str, dict]]:
    from tasks.notifications.jobs import chunk_job_id

    return [
        (chunk_job_id(campaign_id, k), {"campaignId": campaign_id, "chunk": k})
        for k in range(count)
    ]


def run_under_faults(client, stack, sandbox, seed: int) -> None:
    from tasks.jobs.intake.messages import Message, publish
    from tasks.notifications.jobs import LOAD, QUEUE

    # Given a flaky provider: 10% 503s, 5% lost responses after commit, jittery latency
    faults(
        sandbox, errorRate=0.10, dropResponseRate=0.05, latencyMs=2, latencyJitterMs=20, seed=seed
    )
    victim = WorkerProcess(
        stack.home,
        f"victim{seed}",
        concurrency=2,
        queues="notifications",
        extra_env={"KEEL_LOCK_DURATION_S": "6"},
    )
    victim.start()
    try:
        # When a 100k campaign runs, some chunk messages are delivered twice,
        campaign_id = start(client, recipientCount=100_000, chunkSize=5_000)
        wait_for(lambda: wait_state(f"campaign.plan:{campaign_id}", "completed"), timeout=60)
        for job_id, data in chunk_jobs(campaign_id, 20)[::4]:
            publish(Message(job_id, LOAD, QUEUE, data))
        # and a worker is SIGKILLed mid-campaign
        wait_for(
            lambda: (
                client.get(f"{URL}/{campaign_id}", headers=OPERATOR).get_json()["chunks"]["loaded"]
                >= 4
            ),
            timeout=60,
        )
        victim.kill()
        status = finished(client, campaign_id, timeout=240)
    finally:
        victim.kill()
        faults(sandbox)
    # Then the provider's ledger shows every invariant intact
    assert len(status["generations"]) == 10
    assert_invariants(campaign_id)


@pytest.mark.parametrize("seed", [11, 29])
def test_invariants_hold_under_faults_duplicates_and_a_killed_worker(client, stack, sandbox, seed):
    run_under_faults(client, stack, sandbox, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 5, 7, 13, 17, 19, 23, 31, 37, 41])
def test_invariants_hold_under_faults_ten_seeds(client, stack, sandbox, seed):
    run_under_faults(client, stack, sandbox, seed)


def test_a_chunk_failing_for_good_fails_closed_until_resumed(client, sandbox):
    # Given a provider that refuses message loads (400) for now
    faults(sandbox, errorRate=1.0, errorStatus=400, pathContains="/messages")
    try:
        campaign_id = start(client, recipientCount=3_000, chunkSize=1_000)
        # When every chunk fails for good
        wait_for(
            lambda: all(
                wait_state(job_id, "failed", "completed")["state"] == "failed"
                for job_id, _ in chunk_jobs(campaign_id, 3)
            ),
            timeout=60,
        )
    finally:
        faults(sandbox)
    # Then nothing was sent (fail-closed) and the monitor reports the campaign, loudly
    status = client.get(f"{URL}/{campaign_id}", headers=OPERATOR).get_json()
    assert status["state"] == "loading" and not any(g["sent"] for g in status["generations"])
    assert status["chunks"]["loaded"] == 0
    from tasks.notifications.campaigns import watch

    time.sleep(1.1)
    assert campaign_id in watch(quiet_seconds=1)["stalled"]
    assert client.get(f"{URL}/{campaign_id}", headers=OPERATOR).get_json()["stalled"] is True
    # When the fault is lifted and an operator resumes it
    resumed = client.post(f"{URL}/{campaign_id}/resume", headers=OPERATOR)
    assert resumed.status_code == 202 and resumed.get_json()["requeuedChunks"] == 3
    status = finished(client, campaign_id, timeout=60)
    # Then it completes with every invariant intact, and the alarm is gone
    assert status["stalled"] is False
    assert_invariants(campaign_id)
    assert campaign_id not in watch(quiet_seconds=1)["stalled"]


def test_the_monitor_clears_an_entry_revived_after_the_end(client):
    from sqlalchemy import text

    from tasks.notifications.campaigns import watch

    campaign_id = start(client, recipientCount=10)
    finished(client, campaign_id)
    # a late duplicate delivery writes a heartbeat after the campaign ended
    with transaction() as session:
        session.execute(
            text("INSERT INTO campaign_watch VALUES (:c, now() - interval '1 hour')"),
            {"c": campaign_id},
        )
    result = watch(quiet_seconds=1)
    assert campaign_id in result["healed"] and campaign_id not in result["stalled"]
    assert client.get(f"{URL}/{campaign_id}", headers=OPERATOR).get_json()["stalled"] is False
