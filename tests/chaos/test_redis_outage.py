"""Scenario 4: Redis is down for a while (5 s by default, 30 s in the slow tier).

Decision (docs/jobs.md, "Job semantics"): the API keeps accepting jobs.
Postgres is the system of record, so ``POST /api/v1/reports`` commits the
record, fails to publish, parks the job in the durable delayed set and
answers 202 at once; a worker's promoter publishes it when Redis is back.
Why test it: a publish that retries for long would turn a broker outage
into an API outage, and a parked job that nobody publishes would be lost.
"""

from __future__ import annotations

import time

import pytest

from tasks.reports.operation_key import operation_key
from tests.support.chaos import settle, stragglers
from tests.support.client import bearer, unique, wait_state
from tests.support.outages import embedded_redis, redis_down

OWNER = ("acme", "chaos")
ANSWER_WITHIN_S = 1.0  # what "quickly" means for a POST while Redis is down


def post_report(client) -> tuple[int, dict, str, float]:
    """POST one report; (status, body, operation key, seconds it took)."""
    report_id = unique("outage")
    started = time.monotonic()
    response = client.post(
        "/api/v1/reports", headers=bearer(*OWNER), json={"reportId": report_id, "rows": 7}
    )
    took = time.monotonic() - started
    return response.status_code, response.get_json(), operation_key(*OWNER, report_id, 7), took


def redis_outage(stack, client, worker, down_s: float) -> None:
    embedded_redis(stack)  # skip against an external Redis: it is not ours to stop
    pid = worker.process.pid
    # Given the session worker consuming the reports queue
    status, body, _, _ = post_report(client)
    assert status == 202
    wait_state(body["jobId"], "completed", timeout=30)
    accepted: dict[str, str] = {}
    latencies: list[float] = []
    states: set[str] = set()
    # When Redis is down for `down_s` seconds while reports keep coming in
    with redis_down(stack):
        down_at = time.monotonic()
        while time.monotonic() - down_at < down_s:
            status, body, key, took = post_report(client)
            latencies.append(took)
            assert status == 202, body
            assert body["accepted"] is True and body["deduplicated"] is False
            accepted[body["jobId"]] = key
            # the accepted job is in the records (parked for publishing), visible to its owner
            seen = client.get(body["statusUrl"], headers=bearer(*OWNER))
            assert seen.status_code == 200
            states.add(seen.get_json()["state"])
            time.sleep(0.2)
        outage_s = time.monotonic() - down_at
    back_at = time.monotonic()
    # Then every accepted job completes once Redis is back, consumed by the same worker
    result = settle(accepted, timeout=60)
    took = time.monotonic() - back_at
    print(
        f"\nscenario 4 (Redis down {outage_s:.1f} s): {len(accepted)} POSTs answered 202, "
        f"slowest {max(latencies) * 1000:.0f} ms, median "
        f"{sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms; states while down "
        f"{sorted(states)}; {result.figure()}; all done {took:.1f} s after Redis returned"
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert max(latencies) < ANSWER_WITHIN_S, latencies
    assert states <= {"delayed", "waiting"}
    assert worker.process.poll() is None and worker.process.pid == pid


def test_redis_down_5s_api_accepts_quickly_and_loses_nothing(stack, client, worker):
    """Every POST during a 5 s Redis outage answers 202 fast; all complete afterwards."""
    redis_outage(stack, client, worker, down_s=5)


@pytest.mark.slow
def test_redis_down_30s_api_accepts_quickly_and_loses_nothing(stack, client, worker):
    """The same through a 30 s outage."""
    redis_outage(stack, client, worker, down_s=30)
