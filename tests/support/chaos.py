"""Adding report jobs in bulk and counting what survived a fault.

A chaos test's pass figure is a count: jobs completed out of jobs accepted,
runs that completed per job, artifact rows per operation key. These helpers
read them in bulk from the records (one query, not one per job), because a
thousand ``GET``s would take longer than the fault they measure.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from tasks.jobs import Owner
from tasks.jobs.intake.enqueue import add
from tasks.jobs.intake.tenancy import PRIORITY_STEPS
from tasks.platform.db import transaction
from tasks.reports.jobs import GENERATE
from tasks.reports.operation_key import operation_key
from tasks.reports.service import report_options

CHAOS_OWNER = Owner("acme", "chaos")
# kombu's Redis transport keeps a queue's messages in one list per priority step:
# ``queue`` for priority 0, ``queue`` + this separator + the step for the others.
PRIORITY_SEPARATOR = "\x06\x16"


def priority_lists(queue: str) -> list[str]:
    """Every Redis list that holds messages of ``queue`` (see ``tasks.jobs.intake.tenancy``)."""
    return [queue, *(f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS if step)]


def report_data(report_id: str, rows: int = 5) -> dict[str, Any]:
    """A report job's data, as ``tasks.reports.service.submit`` builds it."""
    return {"reportId": report_id, "rows": rows}


def add_reports(
    queue: str, count: int, *, publish_now: bool = True, delay_ms: int = 0
) -> dict[str, str]:
    """``count`` report jobs on ``queue`` (job id → operation key), every record kept.

    Report options as the API sets them (attempts, backoff, dedup on the
    operation key), except retention: the chaos tests count every record, so
    none is trimmed while they count.
    """
    added: dict[str, str] = {}
    for _ in range(count):
        report_id = f"chaos-{uuid.uuid4().hex[:12]}"
        data = report_data(report_id)
        key = operation_key(CHAOS_OWNER.tenant_id, CHAOS_OWNER.user_id, report_id, data["rows"])
        opts = report_options(key, delay_ms).model_copy(
            update={"remove_on_complete": False, "remove_on_fail": False}
        )
        job = add(
            GENERATE, data, queue=queue, opts=opts, owner=CHAOS_OWNER, publish_now=publish_now
        )
        assert job.created
        added[job.job_id] = key
    return added


def job_rows(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """id → state, counters and runs, for every job id that still has a record."""
    with transaction() as session:
        rows = (
            session.execute(
                text(
                    "SELECT id, state, attempts_started, stalled_count, runs, result, "
                    "failed_reason, data FROM jobs WHERE id = ANY(:ids)"
                ),
                {"ids": list(job_ids)},
            )
            .mappings()
            .all()
        )
    return {row["id"]: dict(row) for row in rows}


def archived(job_ids: list[str]) -> set[str]:
    """The jobs whose failed record was trimmed into ``failed_jobs_archive``."""
    with transaction() as session:
        return set(
            session.execute(
                text("SELECT id FROM failed_jobs_archive WHERE id = ANY(:ids)"),
                {"ids": list(job_ids)},
            ).scalars()
        )


def artifact_rows(keys: list[str]) -> dict[str, list[str]]:
    """operation key → the job id of every artifact row stored for it."""
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT operation_key, job_id FROM report_artifacts "
                "WHERE operation_key = ANY(:keys)"
            ),
            {"keys": list(keys)},
        ).all()
    found: dict[str, list[str]] = {}
    for key, job_id in rows:
        found.setdefault(key, []).append(job_id)
    return found


def completed_runs(row: dict[str, Any]) -> int:
    return sum(1 for run in row["runs"] if run.get("outcome") == "completed")


@dataclass
class Tally:
    """What became of a set of report jobs (job id → operation key)."""

    total: int
    states: Counter = field(default_factory=Counter)
    completed: int = 0
    trimmed: int = 0  # completed, then removed by retention (its key's artifact is stored)
    lost: list[str] = field(default_factory=list)  # not completed, nor trimmed after completing
    twice: list[str] = field(default_factory=list)  # more than one completed run
    missing_artifacts: list[str] = field(default_factory=list)
    duplicate_artifacts: int = 0  # artifact rows beyond the first, per operation key
    runs: int = 0

    def figure(self) -> str:
        return (
            f"{self.completed}/{self.total} completed ({self.trimmed} trimmed after "
            f"completing), {len(self.lost)} lost, {len(self.twice)} completed twice, "
            f"{self.duplicate_artifacts} duplicate artifacts, "
            f"{len(self.missing_artifacts)} missing artifacts, {self.runs} runs"
        )

    @property
    def clean(self) -> bool:
        return (
            self.completed == self.total
            and not self.lost
            and not self.twice
            and not self.missing_artifacts
            and self.duplicate_artifacts == 0
        )


def tally(jobs: dict[str, str]) -> Tally:
    """Count completions, runs and artifacts of report jobs, in three queries.

    A record trimmed by retention counts as completed only if it was not
    archived as a failure and the artifact of its operation key is stored
    (retention deletes finished records only; failed ones are archived).
    """
    ids = list(jobs)
    rows = job_rows(ids)
    gone_failed = archived([i for i in ids if i not in rows])
    stored = artifact_rows(list(set(jobs.values())))
    result = Tally(total=len(jobs))
    for job_id, key in jobs.items():
        owners = stored.get(key, [])
        row = rows.get(job_id)
        if row is None:
            done = job_id not in gone_failed and bool(owners)
            result.states["trimmed" if done else "missing"] += 1
            result.trimmed += done
        else:
            result.states[row["state"]] += 1
            result.runs += len(row["runs"])
            done = row["state"] == "completed"
            if completed_runs(row) > 1:
                result.twice.append(job_id)
        if done:
            result.completed += 1
        else:
            result.lost.append(job_id)
        if not owners:
            result.missing_artifacts.append(job_id)
    result.duplicate_artifacts = sum(len(v) - 1 for v in stored.values())
    return result


def settle(jobs: dict[str, str], timeout: float, interval: float = 0.5) -> Tally:
    """Wait until every job completed, or ``timeout`` s passed; the tally either way.

    The caller asserts on the tally, so a failure shows what became of the
    stragglers (their states and runs) instead of a bare timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = tally(jobs)
        if result.completed == result.total or time.monotonic() >= deadline:
            return result
        time.sleep(interval)


def stragglers(result: Tally, limit: int = 5) -> list[dict[str, Any]]:
    """The records of a few jobs that did not complete, for an assertion message."""
    rows = job_rows(result.lost[:limit])
    return [
        {
            k: v
            for k, v in rows.get(i, {"id": i, "state": "no record"}).items()
            if k not in ("result", "data")
        }
        for i in result.lost[:limit]
    ]


def ensure_broker_epoch() -> None:
    """Make sure the broker epoch exists before a test publishes messages by hand.

    In a fresh Redis the first promoter to look finds no epoch and republishes
    every waiting job (``tasks.jobs.upkeep.broker_reset``) — a message the test did
    not ask for. Claiming the epoch first keeps the test's deliveries its own.
    """
    from tasks.jobs.upkeep.broker_reset import check_epoch

    check_epoch()
