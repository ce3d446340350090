"""Scenario 11: a soak — report jobs and campaigns under worker kills, a Redis restart and
provider faults, for ``KEEL_SOAK_SECONDS`` (600 by default).

Why: each fault alone is covered by its own scenario; a long mixed run finds
what they do together (a kill during a republish, a restart during a chord,
retries under a flaky provider) and what only shows up after many rounds.
Pass figures: every campaign verifies against the provider's ledger, 0 lost
jobs (every accepted report completes; every campaign job ends completed),
0 duplicate artifacts. The figures are printed at the end (run with ``-s``)::

    KEEL_SOAK_SECONDS=90 .venv/bin/pytest -m slow tests/chaos -k soak -s
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections import Counter

import pytest
import requests
from sqlalchemy import text

from tasks.db import transaction
from tasks.notifications.verify import verify
from tasks.reports.operation_key import operation_key
from tests.support.chaos import settle, stragglers
from tests.support.client import bearer, unique
from tests.support.outages import embedded_redis
from tests.support.stack import sandbox_admin_headers

SOAK_SECONDS = float(os.environ.get("KEEL_SOAK_SECONDS", "600"))
SOAK_SEED = int(os.environ.get("KEEL_SOAK_SEED", "11"))
REPORTER = ("acme", "soak")
OPERATOR = bearer(roles=("operator",))
WORKER_ENV = {"KEEL_LOCK_DURATION_S": "10"}  # a killed worker's jobs are claimable 10 s later
QUEUES = "reports,notifications"
POOL_SIZE = 2


def faults(sandbox, **settings) -> None:
    response = requests.put(
        f"{sandbox.url}/admin/faults", json=settings, headers=sandbox_admin_headers(), timeout=5
    )
    assert response.status_code == 200, response.text


class Soak:
    """The running soak: what it submitted, what it broke, and how the API answered."""

    def __init__(self, client, rng: random.Random) -> None:
        self.client = client
        self.rng = rng
        self.reports: dict[str, str] = {}  # job id → operation key
        self.campaigns: dict[str, int] = {}  # campaign id → recipients
        self.statuses: Counter = Counter()
        self.latencies: list[float] = []
        self.deduplicated = 0
        self.kills = 0
        self.restarts = 0
        self.last_report: tuple[str, int] | None = None

    def post(self, path: str, body: dict, headers: dict) -> tuple[int, dict]:
        started = time.monotonic()
        response = self.client.post(path, json=body, headers=headers)
        self.latencies.append(time.monotonic() - started)
        self.statuses[response.status_code] += 1
        return response.status_code, response.get_json()

    def submit_report(self) -> None:
        """A new report; now and then one that fails its first run, or a repeated request."""
        if self.last_report and self.rng.random() < 0.05:
            report_id, rows = self.last_report  # the same request again: deduplicated
            body: dict = {"reportId": report_id, "rows": rows}
        else:
            report_id, rows = unique("soak"), self.rng.randint(1, 5000)
            body = {"reportId": report_id, "rows": rows}
            if self.rng.random() < 0.1:
                body["failUntilAttempt"] = 1
        status, answer = self.post("/api/v1/reports", body, bearer(*REPORTER))
        if status != 202:
            return
        self.deduplicated += answer["deduplicated"]
        self.reports[answer["jobId"]] = operation_key(*REPORTER, report_id, rows)
        self.last_report = (report_id, rows)

    def start_campaign(self) -> None:
        recipients = self.rng.choice([3_000, 8_000, 15_000, 25_000])
        body = {
            "name": "soak",
            "category": "marketing",
            "template": "Hi {seq}!",
            "recipientCount": recipients,
            "chunkSize": self.rng.choice([1_000, 2_500, 5_000]),
        }
        status, answer = self.post("/api/v1/campaigns", body, OPERATOR)
        if status == 202:
            self.campaigns[answer["campaignId"]] = recipients


def campaign_state(client, campaign_id: str) -> str:
    return client.get(f"/api/v1/campaigns/{campaign_id}", headers=OPERATOR).get_json()["state"]


def campaign_job_states(campaign_ids: list[str]) -> Counter:
    """States of every job of these campaigns (plan, chunk loads, groups, sends, finalize)."""
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT state, count(*) FROM jobs WHERE queue = 'notifications' "
                "AND data->>'campaignId' = ANY(:ids) GROUP BY state"
            ),
            {"ids": campaign_ids},
        ).all()
    return Counter(dict(rows))


def wait_until(predicate, timeout: float, interval: float = 1.0):
    """Poll ``predicate`` until it holds or ``timeout`` s passed; the caller asserts after."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return value


def run_soak(stack, client, spawn, sandbox, seconds: float) -> None:
    embedded_redis(stack)  # skip against an external Redis: it is not ours to restart
    rng = random.Random(SOAK_SEED)
    soak = Soak(client, rng)
    # Given a flaky provider and a pool of workers on the reports and notifications queues
    faults(
        sandbox,
        errorRate=0.05,
        dropResponseRate=0.02,
        latencyMs=2,
        latencyJitterMs=10,
        seed=rng.randrange(10_000),
    )
    pool = [
        spawn("soak", concurrency=2, queues=QUEUES, extra_env=WORKER_ENV) for _ in range(POOL_SIZE)
    ]
    started = time.monotonic()
    end = started + seconds
    restart_at = started + seconds / 2
    campaign_every = max(20.0, seconds / 10)
    next_campaign, next_kill = started, started + rng.uniform(15, 30)
    # When reports and campaigns keep coming while workers are SIGKILLed at random
    # (each replaced), and Redis restarts empty once, half-way through
    try:
        while (now := time.monotonic()) < end:
            soak.submit_report()
            soak.submit_report()
            if now >= next_campaign:
                soak.start_campaign()
                next_campaign += campaign_every
            if now >= next_kill:
                victim = pool.pop(rng.randrange(len(pool)))
                victim.kill()
                soak.kills += 1
                pool.append(spawn("soak", concurrency=2, queues=QUEUES, extra_env=WORKER_ENV))
                next_kill = time.monotonic() + rng.uniform(15, 35)
            if not soak.restarts and now >= restart_at:
                stack.restart_redis()
                soak.restarts += 1
            time.sleep(0.4)
    finally:
        faults(sandbox)
    load_s = time.monotonic() - started
    # Then every accepted report completes, once, with one artifact per operation key
    result = settle(soak.reports, timeout=240, interval=2)
    # and every campaign completes, every one of its jobs completed, and verifies
    ids = list(soak.campaigns)
    wait_until(lambda: all(campaign_state(client, c) == "completed" for c in ids), 420, 2)
    unfinished = {c: campaign_state(client, c) for c in ids}
    unfinished = {c: s for c, s in unfinished.items() if s != "completed"}
    wait_until(lambda: set(campaign_job_states(ids)) <= {"completed"}, 120, 1)
    job_states = campaign_job_states(ids)
    checks = {c: verify(c) for c in ids if c not in unfinished}
    failed_checks = {c: [k.name for k in found if not k.ok] for c, found in checks.items()}
    failed_checks = {c: names for c, names in failed_checks.items() if names}
    landed = sum(found[2].figures["landed"] for found in checks.values())
    settled_s = time.monotonic() - started - load_s
    print(
        f"\nsoak: {load_s:.0f} s of load (+{settled_s:.0f} s to settle), seed {SOAK_SEED}, "
        f"{soak.kills} workers SIGKILLed, {soak.restarts} Redis restart(s), provider faults on\n"
        f"  reports: {len(soak.reports)} accepted ({soak.deduplicated} deduplicated answers); "
        f"{result.figure()}\n"
        f"  campaigns: {len(ids)} started, {len(ids) - len(unfinished)} completed, "
        f"{len(checks) - len(failed_checks)} verified (4 invariants each), "
        f"{sum(soak.campaigns.values())} recipients, {landed} messages landed; "
        f"campaign jobs by state {dict(job_states)}\n"
        f"  API: {dict(soak.statuses)}, median {statistics.median(soak.latencies) * 1000:.0f} ms, "
        f"slowest {max(soak.latencies) * 1000:.0f} ms"
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert result.duplicate_artifacts == 0 and not result.lost
    assert unfinished == {}
    assert failed_checks == {}
    assert set(job_states) <= {"completed"}, job_states
    assert set(soak.statuses) == {202}, soak.statuses
    assert soak.kills >= 1 and soak.restarts == 1 and ids


@pytest.mark.slow
@pytest.mark.timeout(SOAK_SECONDS + 1200)
def test_soak_reports_and_campaigns_under_kills_a_redis_restart_and_provider_faults(
    stack, client, spawn, sandbox
):
    """Mixed load for KEEL_SOAK_SECONDS: campaigns verify, 0 lost jobs, 0 duplicate artifacts."""
    run_soak(stack, client, spawn, sandbox, SOAK_SECONDS)
