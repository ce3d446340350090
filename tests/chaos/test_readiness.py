"""``/readyz`` says whether this API can accept work, quickly; ``keel status`` the rest.

Why: a load balancer routes traffic on ``/readyz``, so it must say no while
Postgres hangs (a job is its record) and must not hang itself when a server
does — but Redis down or no worker consuming must not take every API pod out
of service: jobs are recorded and parked, and wait. Those are the whole
system's problems, named by ``keel status`` (exit 1) and
``GET /api/v1/system/status`` (the metrics token's: system-wide). A worker's
container health check answers for that worker and rides out a Redis outage
shorter than its grace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil

from tasks.jobs.upkeep import liveness
from tests.support.client import bearer, metrics_headers
from tests.support.keel_up import KEEL, command_line
from tests.support.outages import embedded_postgres, postgres_hung, redis_down
from tests.support.stack import wait_for

ANSWER_WITHIN_S = 2.0


def readyz(client) -> tuple[int, dict, float]:
    started = time.monotonic()
    response = client.get("/readyz")
    return response.status_code, response.get_json(), time.monotonic() - started


def failing(body: dict) -> set[str]:
    return {detail["check"] for detail in body["details"]}


@contextmanager
def stopped(pids: list[int]) -> Iterator[None]:
    """SIGSTOP the processes for the block (a hung server: connections accepted, no answers)."""
    for pid in pids:
        with suppress(ProcessLookupError):  # one that exited meanwhile needs no stopping
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def keel_status() -> tuple[int, str]:
    done = subprocess.run([KEEL, "status"], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def failing_lines(said: str) -> set[str]:
    return {line.split()[1] for line in said.splitlines() if line.startswith("FAIL")}


def test_readyz_is_ok_when_postgres_and_redis_are(client, worker):
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)
    status, body, took = readyz(client)
    assert status == 200 and took < ANSWER_WITHIN_S
    assert body == {"status": "ready", "checks": {"postgres": "ok", "redis": "ok"}}
    assert client.get("/healthz").get_json() == {"status": "ok"}


def test_a_hung_postgres_is_named_within_2_s(stack, client, worker):
    postmaster = embedded_postgres(stack).pid
    with stopped([postmaster]):
        status, body, took = readyz(client)
    assert status == 503 and took < ANSWER_WITHIN_S, (status, took)
    assert body["error"] == "not_ready" and failing(body) == {"postgres"}
    assert body["message"] == "not ready: postgres"
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)


def scrape_errors(exposed: str, source: str) -> float:
    for line in exposed.splitlines():
        if line.startswith(f'keel_scrape_errors_total{{source="{source}"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no scrape error counter for {source}:\n{exposed[:2000]}")


def test_metrics_answer_while_postgres_hangs_with_the_redis_series_and_an_error(
    stack, client, worker
):
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)
    healthy = client.get("/metrics", headers=metrics_headers()).get_data(as_text=True)
    assert 'keel_jobs{queue="reports",state="waiting"}' in healthy
    errors_before = scrape_errors(healthy, "postgres")
    with postgres_hung(stack):  # every process of the cluster: open connections hang too
        started = time.monotonic()
        response = client.get("/metrics", headers=metrics_headers())
        took = time.monotonic() - started
    exposed = response.get_data(as_text=True)
    # The scrape answers, in about the request's database deadline, without Postgres's series
    assert response.status_code == 200 and took < ANSWER_WITHIN_S, (response.status_code, took)
    assert "keel_jobs{" not in exposed and "keel_jobs_delayed_due{" not in exposed
    # With Redis's (the worker's heartbeat, the run counters) and the error counted
    workers = [line for line in exposed.splitlines() if line.startswith("keel_workers_alive ")]
    assert workers and float(workers[0].split()[1]) >= 1, exposed[:2000]
    assert "# TYPE keel_dead_letters gauge" in exposed
    for source in ("redis", "liveness"):  # Redis's sources were read whole
        assert scrape_errors(exposed, source) == scrape_errors(healthy, source)
    assert scrape_errors(exposed, "postgres") == errors_before + 1
    assert 'keel_metrics_source_up{source="postgres"} 0.0' in exposed
    assert 'keel_metrics_source_up{source="postgres"} 1.0' in healthy
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)


def test_redis_down_is_reported_but_the_api_stays_ready(stack, client, worker):
    with redis_down(stack):
        status, body, took = readyz(client)
        accepted = client.post(
            "/api/v1/reports", json={"reportId": "r-redis-down", "rows": 5}, headers=bearer()
        )
        code, said = keel_status()
    # Then the API is ready and takes the job (parked), and Redis is reported down
    assert status == 200 and took < ANSWER_WITHIN_S, (status, took, body)
    assert body["checks"]["postgres"] == "ok"
    assert body["checks"]["redis"].startswith("unavailable"), body
    assert accepted.status_code == 202, accepted.get_json()
    # And the system's status is unhealthy, naming Redis
    assert code == 1 and "redis" in failing_lines(said), said
    wait_for(lambda: client.get("/readyz").get_json()["checks"]["redis"] == "ok", timeout=60)


def test_without_workers_the_api_is_ready_and_keel_status_names_them(stack, client, worker):
    # Given every worker this session started, held still (their heartbeats stop) ...
    workers = [
        p.pid for p in psutil.Process().children(recursive=True) if "worker" in command_line(p)
    ]
    assert worker.process.pid in workers
    with stopped(workers):
        # ... and their last beats aged out (here: removed, rather than waiting 10 s)
        liveness.quick_client().delete(liveness.key("worker"))
        status, body, took = readyz(client)
        accepted = client.post(
            "/api/v1/reports", json={"reportId": "r-no-workers", "rows": 5}, headers=bearer()
        )
        code, said = keel_status()
        seen = client.get("/api/v1/system/status", headers=metrics_headers())
    # Then the API is still ready and accepts a report (it waits for a worker)
    assert status == 200 and took < ANSWER_WITHIN_S, (status, took, body)
    assert accepted.status_code == 202, accepted.get_json()
    # And `keel status` exits 1 naming the workers; the system endpoint says the same
    assert code == 1 and "workers" in failing_lines(said), said
    assert seen.status_code == 200
    system = seen.get_json()
    assert system["healthy"] is False and system["checks"]["workers"]["ok"] is False
    assert system["checks"]["postgres"]["ok"] is True
    # And once they run again, they beat again, and the report completes
    wait_for(lambda: "workers" not in failing_lines(keel_status()[1]), timeout=30)
    job_url = accepted.get_json()["statusUrl"]
    wait_for(
        lambda: client.get(job_url, headers=bearer()).get_json()["state"] == "completed",
        timeout=60,
    )


def test_the_system_status_is_for_the_metrics_token(client):
    assert client.get("/api/v1/system/status").status_code == 401
    assert client.get("/api/v1/system/status", headers=bearer()).status_code == 403
    operator = bearer(roles=("operator",))  # a tenant's: the status is system-wide
    assert client.get("/api/v1/system/status", headers=operator).status_code == 403
    assert client.get("/api/v1/system/status", headers=metrics_headers()).status_code == 200


def test_the_container_health_check_sees_this_hosts_worker(worker):
    # Given the session's worker on this host; when compose's health check runs
    check = [sys.executable, "-m", "tasks.jobs.upkeep.healthcheck"]
    alive = subprocess.run([*check, "worker"], capture_output=True, text=True, timeout=60)
    nobody = subprocess.run([*check, "nobody"], capture_output=True, text=True, timeout=60)
    # Then it passes for the worker, and fails for a kind of process that never beat
    assert alive.returncode == 0, alive.stdout + alive.stderr
    assert f"{worker.name}@" in alive.stdout
    assert nobody.returncode == 1 and "no recent heartbeat" in nobody.stdout


def test_the_worker_health_check_rides_out_a_short_redis_outage(stack, worker):
    check = [sys.executable, "-m", "tasks.jobs.upkeep.healthcheck", "worker"]

    def health(grace_s: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, **({"KEEL_HEALTH_REDIS_GRACE_S": grace_s} if grace_s else {})}
        return subprocess.run(check, capture_output=True, text=True, timeout=60, env=env)

    with redis_down(stack):
        time.sleep(liveness.HEARTBEAT_S * 2)  # beats written meanwhile: the loop runs, Redis not
        # Within the grace (60 s by default) the worker is healthy: no restart for a blip
        riding = health()
        # Past a grace shorter than the outage so far, it is not
        cut = health(grace_s="1")
    assert riding.returncode == 0, riding.stdout + riding.stderr
    assert f"{worker.name}@" in riding.stdout
    assert cut.returncode == 1 and "cut from redis" in cut.stdout, cut.stdout
    assert f"{worker.name}@" in cut.stdout
    # And with Redis back, the worker's next beats make it plainly healthy again
    wait_for(lambda: health(grace_s="1").returncode == 0, timeout=30)
