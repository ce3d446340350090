"""P3: ``POST /api/v1/reports`` under load, beside ``GET /healthz`` of the same server.

One gunicorn (``web:create_app()``, gthread workers, as ``keel up`` runs it)
serves both; the trivial endpoint is the ceiling of this server, client and
machine, so the ratio isolates what submitting a report costs. No worker
runs: the figure is the API's accept path (auth, validation, dedup claim,
record, event, publish), not report generation. Every request carries a
distinct ``reportId`` so nothing is deduplicated away.
"""

from __future__ import annotations

import json
import os

from sqlalchemy import text

from bench.loadgen import LoadResult, RequestFactory, run_load
from bench.meters import CpuMeter
from bench.plan import Run, Sizes
from bench.procs import gunicorn
from bench.stats import Figure, Series, ratio

RPS_TARGET = 500
P99_TARGET_MS = 50
# The API limits each tenant (KEEL_TENANT_RATE_LIMIT, default 6000/minute); the load is
# spread so no tenant reaches it: the limiter's cost is measured, its 429s are not.
TENANTS = 32


def _token(tenant: str, roles: list[str]) -> str:
    from web.tokens import issue_token

    return issue_token(os.environ["KEEL_SECRET_KEY"], tenant, "bench-user", roles, 24 * 3600)


def _healthz(t: int, i: int) -> tuple[str, str, bytes | None, dict[str, str]]:
    return "GET", "/healthz", None, {}


def _reports(run: Run, rep: int) -> RequestFactory:
    """Distinct reportIds, spread over TENANTS tenants: no request is deduplicated or limited."""
    headers = [
        {
            "Authorization": f"Bearer {_token(f'{run.tag}-t{k}', [])}",
            "Content-Type": "application/json",
        }
        for k in range(TENANTS)
    ]

    def make(t: int, i: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        body = json.dumps({"reportId": f"r{rep}-{t}-{i}", "rows": 100}).encode()
        return "POST", "/api/v1/reports", body, headers[(t + i) % TENANTS]

    return make


def _cleanup(run: Run) -> None:
    """Remove this run's report jobs (and, on a Redis we own, their queued messages: left
    there, the next figure's workers take every one and drop it, at a cost that figure
    measures as its own)."""
    from tasks.celery import app
    from tasks.jobs.store import counts
    from tasks.platform.db import transaction

    tenants = f"{run.tag}-t%"
    with transaction() as session:
        mine = "SELECT id FROM jobs WHERE tenant_id LIKE :t"
        session.execute(text(f"DELETE FROM dedup_claims WHERE job_id IN ({mine})"), {"t": tenants})
        session.execute(text("DELETE FROM jobs WHERE tenant_id LIKE :t"), {"t": tenants})
    while counts.compact():
        pass
    if run.env.owns_redis:  # every priority list of the queue (kombu's purge), not only the first
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge("reports")


def p3_http(run: Run) -> Figure:
    sizes = run.sizes
    fig = Figure(
        "P3",
        "POST /api/v1/reports under load",
        target=f"≥ {RPS_TARGET} req/s with p99 ≤ {P99_TARGET_MS} ms",
    )
    health_rps, reports_rps = Series("GET /healthz", "req/s"), Series("POST /reports", "req/s")
    lat = {
        name: Series(name, "ms", chart=False)
        for name in ("healthz p50", "healthz p99", "reports p50", "reports p99")
    }
    cpu = {
        name: Series(f"{name} CPU per request", "ms", chart=False)
        for name in ("healthz", "reports")
    }
    runs: list[dict] = []
    server = gunicorn(run.env, sizes.http_workers)
    with server:
        for rep in range(run.repeat):
            for name, make, rps in (
                ("healthz", _healthz, health_rps),
                ("reports", _reports(run, rep), reports_rps),
            ):
                run.log(
                    f"P3 rep {rep + 1}/{run.repeat}: {name}, {sizes.http_seconds:.0f}s "
                    f"x {sizes.http_concurrency} connections"
                )
                warm = _load(server.port, make, sizes.http_warmup_seconds, sizes)
                meter = CpuMeter({"gunicorn": server.pid, **run.env.server_pids()})
                before = meter.read()
                result = _load(server.port, make, sizes.http_seconds, sizes)
                spent = CpuMeter.spent(before, meter.read())  # "bench process": the load generator
                per_request = {k: 1000 * v / max(1, result.ok) for k, v in spent.items()}
                cpu[name].samples.append(sum(per_request.values()))
                _check(warm, f"{name} warm-up")
                _check(result, name)
                rps.samples.append(result.rps)
                lat[f"{name} p50"].samples.append(result.p(50))
                lat[f"{name} p99"].samples.append(result.p(99))
                runs.append(
                    {
                        "endpoint": name,
                        "rep": rep,
                        **result.summary(),
                        "cpu_ms_per_request": per_request,
                    }
                )
                run.log(
                    f"  {name}: {result.rps:.0f} req/s, p50 {result.p(50):.1f} ms, "
                    f"p99 {result.p(99):.1f} ms"
                )
    _cleanup(run)
    fig.series = [health_rps, reports_rps, *lat.values(), *cpu.values()]
    fig.ratio = ratio(reports_rps, health_rps)
    fig.ratio_text = "POST /reports / GET /healthz (req/s)"
    fig.met = reports_rps.median >= RPS_TARGET and lat["reports p99"].median <= P99_TARGET_MS
    fig.details = {
        "runs": runs,
        "gunicorn_workers": sizes.http_workers,
        "connections": sizes.http_concurrency,
        "seconds": sizes.http_seconds,
    }
    load_cpu = sum(r["client_cpu_s"] for r in runs) / sum(r["duration_s"] for r in runs)
    fig.notes.append(
        f"closed loop, {sizes.http_concurrency} connections, {sizes.http_workers} gunicorn gthread "
        f"workers, {TENANTS} tenants, no Celery worker running; the load generator used "
        f"{load_cpu:.2f} CPU cores on average; CPU per request counts every process "
        f"(gunicorn, Postgres, Redis, load generator): at {cpu['reports'].median:.1f} ms, two "
        f"fully free cores serve at most {2000 / cpu['reports'].median:.0f} req/s"
    )
    return fig


def _load(port: int, make: RequestFactory, seconds: float, sizes: Sizes) -> LoadResult:
    return run_load("127.0.0.1", port, make, duration_s=seconds, concurrency=sizes.http_concurrency)


def _check(result: LoadResult, what: str) -> None:
    if result.errors or result.ok != len(result.latencies_ms):
        raise RuntimeError(f"P3 {what}: {result.errors} errors, statuses {dict(result.statuses)}")
