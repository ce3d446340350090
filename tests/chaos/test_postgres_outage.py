"""Scenario 5: Postgres is stopped for a while (5 s by default, 30 s in the slow tier).

Why: Postgres is the system of record, so while it is down nothing can be
accepted — the API must say so at once (503 with ``Retry-After``, within
2 s, never a hang) — and nothing already accepted may be lost: deliveries
that cannot claim their record must come back later, jobs interrupted
mid-run must be recovered as stalled, delayed jobs that fall due during the
outage must still be published, and the same worker must carry on when the
database returns.
"""

from __future__ import annotations

import time

import pytest

from tasks.reports.operation_key import operation_key
from tests.support.chaos import add_reports, job_rows, settle, stragglers
from tests.support.client import bearer, unique
from tests.support.outages import embedded_postgres, postgres_down
from tests.support.stack import wait_for

OWNER = ("acme", "chaos")
ANSWER_WITHIN_S = 2.0
LOCK_S = 3  # the consumer's job locks: interrupted jobs are claimable again 3 s later


def post_report(client) -> tuple[int, dict, dict, str, float]:
    """POST one report; (status, body, headers, operation key, seconds it took)."""
    report_id = unique("pgdown")
    started = time.monotonic()
    response = client.post(
        "/api/v1/reports", headers=bearer(*OWNER), json={"reportId": report_id, "rows": 9}
    )
    took = time.monotonic() - started
    return (
        response.status_code,
        response.get_json(),
        dict(response.headers),
        operation_key(*OWNER, report_id, 9),
        took,
    )


def completed(jobs: dict[str, str]) -> int:
    return sum(1 for row in job_rows(list(jobs)).values() if row["state"] == "completed")


def postgres_outage(stack, client, spawn, worker, down_s: float) -> None:
    embedded_postgres(stack)  # skip against an external Postgres: it is not ours to stop
    # Given a worker with a backlog of report jobs on a dedicated queue (some running,
    # most waiting when Postgres stops), and delayed jobs that fall due during the outage
    queue = unique("chaos-pg")
    consumer = spawn(
        "pg", concurrency=2, queues=queue, extra_env={"KEEL_LOCK_DURATION_S": str(LOCK_S)}
    )
    pid = consumer.process.pid
    jobs = add_reports(queue, 80)
    jobs |= add_reports(queue, 5, delay_ms=int(down_s * 1000 / 2))
    # and reports accepted by the API (the session worker runs them)
    accepted: dict[str, str] = {}
    for _ in range(3):
        status, body, _, key, _ = post_report(client)
        assert status == 202, body
        accepted[body["jobId"]] = key
    wait_for(lambda: completed(jobs) >= 10, timeout=60, interval=0.1)
    latencies: list[float] = []
    # When Postgres is stopped for `down_s` seconds
    with postgres_down(stack):
        down_at = time.monotonic()
        while time.monotonic() - down_at < down_s:
            # Then the API answers 503 quickly, for a new job and for a status lookup
            status, body, headers, _, took = post_report(client)
            latencies.append(took)
            assert status == 503, body
            assert body["error"] == "unavailable" and headers.get("Retry-After")
            started = time.monotonic()
            lookup = client.get(
                f"/api/v1/reports/jobs/{next(iter(accepted))}", headers=bearer(*OWNER)
            )
            latencies.append(time.monotonic() - started)
            assert lookup.status_code == 503, lookup.get_json()
            time.sleep(0.3)
        outage_s = time.monotonic() - down_at
    back_at = time.monotonic()
    # And once it is back the API accepts again at its first request,
    status, body, _, key, _ = post_report(client)
    assert status == 202, body
    accepted[body["jobId"]] = key
    # and every job accepted before, during or after the outage completes exactly once
    result = settle(jobs | accepted, timeout=90)
    took = time.monotonic() - back_at
    rows = job_rows(list(jobs))
    recovered = sum(1 for row in rows.values() if row["stalled_count"])
    print(
        f"\nscenario 5 (Postgres down {outage_s:.1f} s): {len(latencies)} API calls answered "
        f"503, slowest {max(latencies) * 1000:.0f} ms; {result.figure()}; "
        f"{recovered} interrupted jobs recovered as stalled; "
        f"all done {took:.1f} s after Postgres returned"
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert max(latencies) < ANSWER_WITHIN_S, latencies
    # by the same worker process, which was not restarted,
    assert consumer.process.poll() is None and consumer.process.pid == pid
    # and which did take deliveries during the outage (and gave them back)
    requeued = consumer.log_path.read_text(errors="replace").count("goes back to its queue")
    print(f"  {requeued} deliveries went back to the queue while Postgres was down")
    assert requeued > 0
    assert {row["runs"][-1]["worker"].split("@")[0] for row in rows.values()} == {consumer.name}


def test_postgres_down_5s_api_answers_503_and_nothing_is_lost(stack, client, spawn, worker):
    """503 within 2 s during a 5 s outage; every accepted job completes afterwards."""
    postgres_outage(stack, client, spawn, worker, down_s=5)


@pytest.mark.slow
def test_postgres_down_30s_api_answers_503_and_nothing_is_lost(stack, client, spawn, worker):
    """The same through a 30 s outage."""
    postgres_outage(stack, client, spawn, worker, down_s=30)
