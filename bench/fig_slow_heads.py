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
import time

from bench.fig_http import TENANTS, _token
from bench.loadgen import LoadResult, RequestFactory, run_load
from bench.plan import Run
from bench.procs import gunicorn
from bench.stats import Figure, Series, ratio
from web.serving import HEAD_TIMEOUT_S

SLOW_CLIENTS = 1000
P99_TARGET_MS = 100
SETTLE_S = 0.5
SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")  # loopback, 250 heads each
PARTIAL_HEAD = b"GET /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n"


def _endpoints(run: Run) -> dict[str, RequestFactory]:
    # spread over P3's tenants, so that no tenant reaches the API's rate limit (its 429s
    # are not what this figure measures)
    auths = [
        {"Authorization": f"Bearer {_token(f'{run.tag}-heads-t{k}', [])}"} for k in range(TENANTS)
    ]

    def healthz(t: int, i: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        return "GET", "/healthz", None, {}

    def jobs(t: int, i: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        return "GET", "/api/v1/jobs?limit=10", None, auths[(t + i) % TENANTS]

    return {"healthz": healthz, "jobs": jobs}


def _hold(port: int, count: int) -> list[socket.socket]:
    """``count`` connections holding a partial head, from ``SOURCES`` in turn: each address
    stays under its share of incomplete heads per process (``web.serving``'s
    ``HEADS_PER_ADDRESS``), so the server holds every one of them."""
    held = []
    for index in range(count):
        source = (SOURCES[index % len(SOURCES)], 0)
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=source)
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
    held_at_end: list[int] = []
    with gunicorn(run.env, sizes.http_workers) as server:
        for rep in range(run.repeat):
            for flood in (False, True):  # alternating: without, with, without, with, ...
                for name, make in endpoints.items():
                    # heads made afresh for each measurement, which ends before their deadline
                    held = _hold(server.port, SLOW_CLIENTS) if flood else []
                    time.sleep(SETTLE_S if flood else 0)  # every head is in and waited for
                    try:
                        result = _measure(run, server.port, make, f"{name}{' (flood)' * flood}")
                        if flood:
                            held_at_end.append(sum(1 for sock in held if still_open(sock)))
                    finally:
                        for sock in held:
                            sock.close()
                    series[(name, flood)].samples.append(result.p(99))
                    runs.append({"endpoint": name, "flood": flood, "rep": rep, **result.summary()})
    fig.series = list(series.values())
    fig.ratio = ratio(series[("jobs", True)], series[("jobs", False)])
    fig.ratio_text = "GET /api/v1/jobs p99 with the flood / without (ms)"
    fig.met = all(series[(name, True)].median <= P99_TARGET_MS for name in endpoints) and all(
        count == SLOW_CLIENTS for count in held_at_end
    )
    fig.details = {
        "runs": runs,
        "slow_clients": SLOW_CLIENTS,
        "held_at_end": held_at_end,
        "workers": sizes.http_workers,
    }
    fig.notes.append(
        f"{SLOW_CLIENTS} loopback connections from {len(SOURCES)} addresses each hold a partial "
        f"head, made afresh for each measurement; held at its end: {min(held_at_end)} to "
        f"{max(held_at_end)}; closed loop of {sizes.http_concurrency} connections per endpoint, "
        f"{_seconds(run):.0f} s each, {sizes.http_workers} gunicorn workers"
    )
    return fig


def _seconds(run: Run) -> float:
    """A measurement's length: P3's, cut to end while its heads are still held (the server
    hangs up on a head unfinished after ``HEAD_TIMEOUT_S``; making them takes about 1 s)."""
    return min(run.sizes.http_seconds, HEAD_TIMEOUT_S - 4 - SETTLE_S)


def still_open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` (it has not hung up on it)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def _measure(run: Run, port: int, make: RequestFactory, what: str) -> LoadResult:
    result = run_load(
        "127.0.0.1", port, make, duration_s=_seconds(run), concurrency=run.sizes.http_concurrency
    )
    if result.errors or result.ok != len(result.latencies_ms):
        raise RuntimeError(f"P12 {what}: {result.errors} errors, statuses {dict(result.statuses)}")
    run.log(f"P12 {what}: p50 {result.p(50):.1f} ms, p99 {result.p(99):.1f} ms")
    return result
