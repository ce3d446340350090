"""``/readyz`` tells the truth, quickly: each part that fails is named, within 2 s.

Why: a load balancer or ``keel up`` routes traffic (and prints "Keel is up")
on this answer, so it must say no while Postgres hangs, Redis is down or no
worker is consuming — and must not hang itself when a server does.
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

from tasks.jobs import liveness
from tests.support.keel_up import command_line
from tests.support.outages import embedded_postgres, redis_down
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


def test_readyz_is_ok_when_postgres_redis_and_a_worker_are(client, worker):
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)
    status, body, took = readyz(client)
    assert status == 200 and took < ANSWER_WITHIN_S
    assert body == {"status": "ready", "checks": {"postgres": "ok", "redis": "ok", "workers": "ok"}}
    assert client.get("/healthz").get_json() == {"status": "ok"}


def test_a_hung_postgres_is_named_within_2_s(stack, client, worker):
    postmaster = embedded_postgres(stack).pid
    with stopped([postmaster]):
        status, body, took = readyz(client)
    assert status == 503 and took < ANSWER_WITHIN_S, (status, took)
    assert body["error"] == "not_ready" and failing(body) == {"postgres"}
    assert body["message"] == "not ready: postgres"
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)


def test_redis_down_is_named(stack, client, worker):
    with redis_down(stack):
        status, body, took = readyz(client)
    assert status == 503 and took < ANSWER_WITHIN_S, (status, took)
    assert "redis" in failing(body) and "postgres" not in failing(body)
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=60)


def test_no_recent_worker_heartbeat_is_named(stack, client, worker):
    # Given every worker this session started, held still (their heartbeats stop) ...
    workers = [
        p.pid for p in psutil.Process().children(recursive=True) if "worker" in command_line(p)
    ]
    assert worker.process.pid in workers
    with stopped(workers):
        # ... and their last beats aged out (here: removed, rather than waiting 10 s)
        liveness.quick_client().delete(liveness.key("worker"))
        status, body, took = readyz(client)
    # Then readiness names the workers, and only them
    assert status == 503 and took < ANSWER_WITHIN_S, (status, took)
    assert failing(body) == {"workers"}
    # And once they run again, they beat again
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)


def test_the_container_health_check_sees_this_hosts_worker(worker):
    # Given the session's worker on this host; when compose's health check runs
    check = [sys.executable, "-m", "tasks.jobs.healthcheck"]
    alive = subprocess.run([*check, "worker"], capture_output=True, text=True, timeout=60)
    nobody = subprocess.run([*check, "nobody"], capture_output=True, text=True, timeout=60)
    # Then it passes for the worker, and fails for a kind of process that never beat
    assert alive.returncode == 0, alive.stdout + alive.stderr
    assert f"{worker.name}@" in alive.stdout
    assert nobody.returncode == 1 and "no recent heartbeat" in nobody.stdout
