"""Reports and campaigns driven through the API of a multi-host stack, and what became of them.

Everything here runs as a client on the client host (``KeelHosts.client``):
HTTP to the api host, SQL to the db host. The counts are read in bulk from
the records (one query per look), like ``tests.support.chaos`` does on the
single-host stack: a job is done once when its record is completed with
exactly one completed run, and its report stored once.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.support.multihost import KeelHosts

REPORTS_URL = "/api/v1/reports"
CAMPAIGNS_URL = "/api/v1/campaigns"
POST_DEADLINE_S = 2.0  # "POST /reports answers 202 within 2 s", whatever Redis does


@dataclass(frozen=True)
class Posted:
    """One ``POST /reports``: who asked, for what, what came back and how long it took."""

    tenant: str
    report_id: str
    status: int
    seconds: float
    job_id: str | None


def tokens(hosts: KeelHosts, tenants: list[str], user: str = "u1") -> dict[str, str]:
    """A bearer token per tenant, from ``keel token`` on the client host (run side by side)."""
    with ThreadPoolExecutor(len(tenants)) as pool:
        issued = pool.map(
            lambda t: hosts.keel("client", "token", "--tenant", t, "--user", user), tenants
        )
        return {t: done.stdout.strip() for t, done in zip(tenants, issued, strict=True)}


def _post_report(hosts: KeelHosts, tenant: str, token: str, report_id: str) -> Posted:
    import requests

    body = {"reportId": report_id, "rows": 10}
    started = time.monotonic()
    try:
        response = requests.post(
            hosts.web_url + REPORTS_URL,
            json=body,
            timeout=10,
            headers={"Authorization": f"Bearer {token}"},
        )
    except requests.RequestException:
        return Posted(tenant, report_id, 0, time.monotonic() - started, None)
    took = time.monotonic() - started
    job_id = response.json().get("jobId") if response.status_code == 202 else None
    return Posted(tenant, report_id, response.status_code, took, job_id)


def post_reports(
    hosts: KeelHosts, tokens_by_tenant: dict[str, str], per_tenant: int, prefix: str
) -> list[Future[Posted]]:
    """Queue ``per_tenant`` report POSTs per tenant on the client's threads (not waited for)."""
    assert hosts.client is not None
    futures = []
    for index in range(per_tenant):
        for tenant, token in tokens_by_tenant.items():
            report_id = f"{prefix}-{index}-{uuid.uuid4().hex[:8]}"
            futures.append(hosts.client.submit(_post_report, hosts, tenant, token, report_id))
    return futures


def start_campaign(hosts: KeelHosts, token: str, recipients: int, chunk_size: int) -> str:
    body = {
        "name": "multihost",
        "category": "marketing",
        "template": "Hello #{seq}",
        "recipientCount": recipients,
        "chunkSize": chunk_size,
    }
    response = hosts.request("POST", CAMPAIGNS_URL, token=token, json=body)
    assert response.status_code == 202, response.text
    return response.json()["campaignId"]


def campaign_state(hosts: KeelHosts, token: str, campaign_id: str) -> dict[str, Any]:
    response = hosts.get(f"{CAMPAIGNS_URL}/{campaign_id}", token=token)
    assert response.status_code == 200, response.text
    return response.json()


@dataclass
class Tally:
    """What became of a set of report jobs."""

    total: int
    states: Counter = field(default_factory=Counter)
    completed_once: int = 0
    twice: list[str] = field(default_factory=list)  # more than one completed run
    missing_artifacts: list[str] = field(default_factory=list)
    duplicate_artifacts: int = 0  # artifact rows beyond the first, per report
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def figure(self) -> str:
        return (
            f"{self.completed_once}/{self.total} completed once, states "
            f"{dict(self.states)}, {len(self.twice)} completed twice, "
            f"{self.duplicate_artifacts} duplicate artifacts, "
            f"{len(self.missing_artifacts)} missing artifacts"
        )

    @property
    def clean(self) -> bool:
        return (
            self.completed_once == self.total
            and not self.twice
            and not self.missing_artifacts
            and self.duplicate_artifacts == 0
        )


def completed_runs(row: dict[str, Any]) -> int:
    return sum(1 for run in row["runs"] if run.get("outcome") == "completed")


def tally(hosts: KeelHosts, posted: list[Posted]) -> Tally:
    """States, completed runs and artifacts of the posted reports, in two queries."""
    ids = [p.job_id for p in posted if p.job_id]
    rows = hosts.sql(
        "SELECT id, state, stalled_count, runs, result FROM jobs WHERE id = ANY(%(ids)s)",
        {"ids": ids},
    )
    by_id = {row["id"]: row for row in rows}
    artifacts = hosts.sql(
        "SELECT tenant_id, report_id, count(*) AS n FROM report_artifacts "
        "WHERE report_id = ANY(%(r)s) GROUP BY tenant_id, report_id",
        {"r": [p.report_id for p in posted]},
    )
    stored = {(a["tenant_id"], a["report_id"]): a["n"] for a in artifacts}
    result = Tally(total=len(posted), rows=by_id)
    for post in posted:
        row = by_id.get(post.job_id or "")
        result.states[row["state"] if row else "no record"] += 1
        runs = completed_runs(row) if row else 0
        if row and row["state"] == "completed" and runs == 1:
            result.completed_once += 1
        if runs > 1:
            result.twice.append(post.job_id)
        if (post.tenant, post.report_id) not in stored:
            result.missing_artifacts.append(post.report_id)
    result.duplicate_artifacts = sum(n - 1 for n in stored.values())
    return result


def settle(hosts: KeelHosts, posted: list[Posted], timeout: float) -> Tally:
    """Wait until every report completed (or ``timeout`` s); the tally either way."""
    deadline = time.monotonic() + timeout
    while True:
        result = tally(hosts, posted)
        done = result.states["completed"] == result.total
        if done or time.monotonic() >= deadline:
            return result
        time.sleep(1)
