"""A notification campaign logs no ERROR: real campaigns through real workers, their logs read.

Every campaign once logged ``Chord callback for ... raised: TypeError('campaign.finalize
takes its data as keyword arguments only')`` from Celery's ``on_chord_part_return`` (the
finalize job still completed). Whatever a campaign's run writes at ERROR (or CRITICAL) in
a worker's log, or in this process (the API's), fails these tests.

A worker of this module's own consumes the ``notifications`` queue; the session's worker
(``worker``), if an earlier module started it, consumes it too, so every worker log of the
session's home is read, from where it ended before the campaign started.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from tasks.platform.db import transaction
from tests.support.client import bearer, unique
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.usefixtures("sandbox")
URL = "/api/v1/campaigns"
OWNER = bearer(tenant=unique("quiet"), user="alice")
# Keel's text lines (KEEL_LOG_FORMAT=text in the suite): "[<time>: ERROR/<process>] ..."
SEVERE = re.compile(r"^\[[^\]]*: (ERROR|CRITICAL)/")


@pytest.fixture(scope="module")
def campaign_worker(stack) -> Iterator[WorkerProcess]:
    process = WorkerProcess(stack.home, unique("campaign-logs"), concurrency=4)
    process.start()
    yield process
    process.stop()


class WorkerLogs:
    """Every ``worker-*.log`` of the session's home, read from where each ended when made."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.start = {path: path.stat().st_size for path in home.glob("worker-*.log")}

    def written(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for path in sorted(self.home.glob("worker-*.log")):
            with path.open("rb") as log:
                log.seek(self.start.get(path, 0))
                found[path.name] = log.read().decode(errors="replace").splitlines()
        return found

    def severe(self) -> list[str]:
        """The ERROR and CRITICAL lines written since, each with the lines that follow it
        (a traceback) up to the next log line."""
        shown: list[str] = []
        for name, lines in self.written().items():
            for index, line in enumerate(lines):
                if SEVERE.match(line):
                    rest = [f"  {more}" for more in lines[index + 1 : index + 12]]
                    shown.append(f"{name}: {line}\n" + "\n".join(rest))
        return shown


def campaign_jobs(campaign_id: str) -> list[dict]:
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT id, name, state, failed_reason FROM jobs "
                "WHERE queue = 'notifications' AND data->>'campaignId' = :c ORDER BY id"
            ),
            {"c": campaign_id},
        )
        return [dict(row) for row in rows.mappings()]


def run_campaign(client, timeout: float, **body) -> str:
    """Start a campaign; return once it is completed and every job of it has ended, the
    chord's callback (``campaign.finalize``) among them."""
    payload = {"name": "quiet sale", "category": "marketing", "template": "Hi {name}!", **body}
    response = client.post(URL, json=payload, headers=OWNER)
    assert response.status_code == 202, response.get_json()
    campaign_id = response.get_json()["campaignId"]

    def done() -> bool:
        status = client.get(f"{URL}/{campaign_id}", headers=OWNER).get_json()
        jobs = campaign_jobs(campaign_id)
        ended = all(job["state"] in ("completed", "failed", "cancelled") for job in jobs)
        finalized = any(
            job["name"] == "campaign.finalize" and job["state"] == "completed" for job in jobs
        )
        return status["state"] == "completed" and ended and finalized

    wait_for(done, timeout=timeout, interval=0.5)
    return campaign_id


def assert_quiet(logs: WorkerLogs, caplog, campaign_id: str) -> None:
    here = [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.ERROR
    ]
    assert not here, "\n".join(here)
    severe = logs.severe()
    assert not severe, f"campaign {campaign_id} logged:\n" + "\n".join(severe)
    failed = [job for job in campaign_jobs(campaign_id) if job["state"] != "completed"]
    assert not failed, failed


LISTED = [{"to": f"+82-10-0000-{n:04d}", "vars": {"name": f"u{n}"}} for n in range(250)]


@pytest.mark.parametrize(
    "body",
    [
        {"recipients": LISTED, "chunkSize": 100},
        {"recipientCount": 2_000, "chunkSize": 100},
    ],
    ids=["250 listed recipients", "2000 recipients in 20 chunks"],
)
def test_a_campaign_logs_no_error(client, stack, campaign_worker, caplog, body):
    # Given the workers' logs as they are now
    caplog.set_level(logging.WARNING)
    logs = WorkerLogs(stack.home)
    # When a campaign runs to its end (its chord's callback included)
    campaign_id = run_campaign(client, timeout=120, **body)
    # Then nothing of it was logged at ERROR, anywhere
    assert_quiet(logs, caplog, campaign_id)


def test_a_campaign_of_20000_recipients_logs_no_error(client, stack, campaign_worker, caplog):
    caplog.set_level(logging.WARNING)
    logs = WorkerLogs(stack.home)
    started = time.monotonic()
    campaign_id = run_campaign(client, timeout=240, recipientCount=20_000)
    status = client.get(f"{URL}/{campaign_id}", headers=OWNER).get_json()
    assert sum(g["messages"] for g in status["generations"]) == 20_000
    assert_quiet(logs, caplog, campaign_id)
    print(f"20k campaign: {time.monotonic() - started:.1f}s")
