"""P12: the API while 1,000 clients hold request heads they never finish.

One gunicorn (as ``keel up`` serves it). Each repetition measures ``GET /healthz`` and an
authenticated ``GET /api/v1/jobs`` first with nothing else connected, then again while
``SLOW_CLIENTS`` loopback connections each hold a partial request head: the heads are read
by each process's main loop without a thread (``web.serving.HeadReader``), so the
answers should not change. The ratio is the list's p99 under the flood over its p99
without it, measured alternately in one run.
"""

from __future__ import annotations

import socket

from bench.fig_http import _token
from bench.loadgen import LoadResult, RequestFactory, run_load
from bench.plan import Run
from bench.procs import gunicorn
from bench.stats import Figure, Series, ratio

SLOW_CLIENTS = 1000
P99_TARGET_MS = 100
PARTIAL_HEAD = b"GET /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n"


def _endpoints(run: Run) -> dict[str, RequestFactory]:
    auth = {"Authorization": f"Bearer {_token(f'{run.tag}-heads', [])}"}

    def healthz(t: int, i: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        return "GET", "/healthz", None, {}

    def jobs(t: int, i: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        return "GET", "/api/v1/jobs?limit=10", None, auth

    return {"healthz": healthz, "jobs": jobs}


def _hold(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(PARTIAL_HEAD)
        held.append(sock)
    return held


def p12_slow_heads(run: Run) -> Figure:
    sizes = run.sizes
    fig = Figure(
        "P12",
        f"the API beside {SLOW_CLIENTS} slow request heads",
        target=f"p99 ≤ {P99_TARGET_MS} ms for /healthz and GET /api/v1/jobs under the flood",
    )
    series = {
        (name, flood): Series(f"{name} p99{' (flood)' if flood else ''}", "ms")
        for name in ("healthz", "jobs")
        for flood in (False, True)
    }
    runs: list[dict] = []
    endpoints = _endpoints(run)
    with gunicorn(run.env, sizes.http_workers) as server:
        for rep in range(run.repeat):
            for flood in (False, True):  # alternating: without, with, without, with, ...
                held = _hold(server.port, SLOW_CLIENTS) if flood else []
                try:
                    for name, make in endpoints.items():
                        result = _measure(run, server.port, make, f"{name}{' (flood)' * flood}")
                        series[(name, flood)].samples.append(result.p(99))
                        runs.append(
                            {"endpoint": name, "flood": flood, "rep": rep, **result.summary()}
                        )
                finally:
                    for sock in held:
                        sock.close()
    fig.series = list(series.values())
    fig.ratio = ratio(series[("jobs", True)], series[("jobs", False)])
    fig.ratio_text = "GET /api/v1/jobs p99 with the flood / without (ms)"
    fig.met = all(series[(name, True)].median <= P99_TARGET_MS for name in endpoints)
    fig.details = {"runs": runs, "slow_clients": SLOW_CLIENTS, "workers": sizes.http_workers}
    fig.notes.append(
        f"{SLOW_CLIENTS} loopback connections each hold a partial head; closed loop of "
        f"{sizes.http_concurrency} connections per endpoint, {sizes.http_seconds:.0f} s each, "
        f"{sizes.http_workers} gunicorn workers"
    )
    return fig


def _measure(run: Run, port: int, make: RequestFactory, what: str) -> LoadResult:
    sizes = run.sizes
    result = run_load(
        "127.0.0.1", port, make, duration_s=sizes.http_seconds, concurrency=sizes.http_concurrency
    )
    if result.errors or result.ok != len(result.latencies_ms):
        raise RuntimeError(f"P12 {what}: {result.errors} errors, statuses {dict(result.statuses)}")
    run.log(f"P12 {what}: p50 {result.p(50):.1f} ms, p99 {result.p(99):.1f} ms")
    return result
