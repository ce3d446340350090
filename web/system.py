"""Liveness, readiness, metrics and the API description."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Iterator
from itertools import chain

from flask import Blueprint, Response, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tasks import health
from tasks.jobs.calls.loading import known_queues
from tasks.jobs.intake import pauses
from tasks.jobs.observe import metrics as job_metrics
from tasks.jobs.observe.queue_counts import counts, due_delayed, oldest_waiting_s
from tasks.jobs.upkeep import liveness
from tasks.platform import deadletters
from tasks.platform.config import get_settings
from web import http_metrics, metrics_lease
from web.api import operation
from web.errors import ApiError
from web.openapi import document
from web.schemas import Health, Open, Readiness, SystemStatus

bp = Blueprint("system", __name__)
log = logging.getLogger(__name__)


# Every metric name /metrics exports (samples carry the suffixes: _total, _bucket, _sum,
# _count); ops/ (alert rules, dashboard) may use only these (tests/unit/test_ops_rules.py).
EXPORTED = frozenset(
    {
        "keel_jobs",
        "keel_jobs_delayed_due",
        "keel_oldest_waiting_seconds",
        "keel_queue_paused",
        "keel_queue_paused_tenants",
        "keel_jobs_held",
        "keel_job_events_total",
        "keel_job_duration_seconds",
        "keel_job_wait_seconds",
        "keel_workers_alive",
        "keel_beat_last_tick_seconds",
        "keel_dead_letters",
        "keel_http_request_duration_seconds",
        "keel_scrape_errors_total",
        "keel_metrics_source_up",
        "keel_metrics_system_wide",
    }
)


def job_states() -> Iterator[Metric]:
    """Postgres: jobs by queue and state (the compacted counters), and delayed jobs whose
    time has come but that no worker promoted yet."""
    queues = known_queues()
    family = GaugeMetricFamily(
        "keel_jobs", "Job records by queue and state", labels=["queue", "state"]
    )
    for queue in queues:
        for state, n in counts(queue).items():
            family.add_metric([queue, state], n)
    due = GaugeMetricFamily(
        "keel_jobs_delayed_due",
        "Delayed jobs whose time has come, not yet promoted (parked, or no worker promotes)",
        labels=["queue"],
    )
    for queue, n in due_delayed(queues).items():
        due.add_metric([queue], n)
    oldest = GaugeMetricFamily(
        "keel_oldest_waiting_seconds",
        "How long the queue's oldest waiting job has waited since it became due (absent: none"
        " waits)",
        labels=["queue"],
    )
    for queue, age in oldest_waiting_s(queues).items():
        oldest.add_metric([queue], age)
    yield family
    yield due
    yield oldest
    yield from paused_queues(queues)


def paused_queues(queues: list[str]) -> Iterator[Metric]:
    """Postgres: the pauses in force (``tasks.jobs.intake.pauses``) and the jobs they hold."""
    whole = GaugeMetricFamily(
        "keel_queue_paused", "1 while the queue is paused for every tenant", labels=["queue"]
    )
    tenants = GaugeMetricFamily(
        "keel_queue_paused_tenants",
        "Tenants whose jobs on the queue are paused (by their own operators)",
        labels=["queue"],
    )
    in_force = pauses.paused()
    for queue in queues:
        whole.add_metric([queue], int(any(p.queue == queue and not p.tenant_id for p in in_force)))
        tenants.add_metric([queue], sum(1 for p in in_force if p.queue == queue and p.tenant_id))
    held = GaugeMetricFamily(
        "keel_jobs_held",
        "Waiting jobs a pause holds (their messages taken; published again on resume)",
        labels=["queue"],
    )
    for queue, n in pauses.held().items():
        held.add_metric([queue], n)
    yield whole
    yield tenants
    yield held


def job_activity() -> Iterator[Metric]:
    """Redis: event counters and run histograms every worker process records."""
    events = CounterMetricFamily(
        "keel_job_events",
        "Queue events by type (failed, retrying, deduplicated, stalled, ...) and job name",
        labels=["queue", "job_name", "event"],
    )
    families = {
        "duration": HistogramMetricFamily(
            "keel_job_duration_seconds",
            "Run time of finished runs, by queue and job name",
            labels=["queue", "job_name"],
        ),
        "wait": HistogramMetricFamily(
            "keel_job_wait_seconds",
            "Time from due to start, by queue and job name",
            labels=["queue", "job_name"],
        ),
    }
    for queue, found in job_metrics.snapshot(known_queues()).items():
        for (event, job_name), n in found["events"].items():
            events.add_metric([queue, job_name, event], n)
        for kind, family in families.items():
            for job_name, histogram in sorted(found[kind].items()):
                buckets, total = _cumulative(histogram)
                family.add_metric([queue, job_name], buckets, sum_value=total)
    yield events
    yield from families.values()


def http_requests() -> Iterator[Metric]:
    """Redis: the API's requests from every web process (``web.http_metrics``)."""
    family = HistogramMetricFamily(
        "keel_http_request_duration_seconds",
        "API requests by method, route template and status, from every web process",
        labels=["method", "route", "status"],
    )
    for labels, histogram in sorted(http_metrics.snapshot().items()):
        running, buckets = 0.0, []
        for bound in [*map(str, http_metrics.BUCKETS), "+Inf"]:
            running += histogram.get(bound, 0.0)
            buckets.append((bound, running))
        family.add_metric(list(labels), buckets, sum_value=histogram.get("sum", 0.0))
    yield family


def processes() -> Iterator[Metric]:
    """Redis: live workers, beat's last tick, dead letters (read with a client that fails
    within a second rather than retrying)."""
    client = liveness.quick_client()
    workers = GaugeMetricFamily(
        "keel_workers_alive", f"Workers that beat in the last {liveness.FRESH_S:.0f} s"
    )
    workers.add_metric([], len(liveness.fresh(client, "worker")))
    yield workers
    since = liveness.since_last(client, "beat")
    if since is not None:
        beat = GaugeMetricFamily(
            "keel_beat_last_tick_seconds", "Seconds since beat last ticked (Redis's clock)"
        )
        beat.add_metric([], since)
        yield beat
    letters = GaugeMetricFamily(
        "keel_dead_letters", "Unreadable messages set aside, per queue", labels=["queue"]
    )
    for queue in deadletters.queues(client):
        letters.add_metric([queue], client.llen(deadletters.key(queue)))
    yield letters


def _cumulative(histogram: dict[str, float]) -> tuple[list[tuple[str, float]], float]:
    running, buckets = 0.0, []
    for bound in [*map(str, job_metrics.BUCKETS), "+Inf"]:
        running += histogram.get(bound, 0.0)
        buckets.append((bound, running))
    return buckets, histogram.get("sum", 0.0)


disable_created_metrics()  # no `_created` series beside each counter: nothing reads them
SCRAPE_ERRORS = Counter(
    "keel_scrape_errors",
    "Scrapes that could not read a source; its series were left out of that scrape",
    ["source"],
    registry=None,
)


class Source:
    """One source of a scrape's series: a failing source (Postgres down, Redis away) leaves
    its series out of that scrape and counts an error; the other sources still answer."""

    def __init__(self, name: str, read: Callable[[], Iterator[Metric]]) -> None:
        self.name, self.read = name, read
        SCRAPE_ERRORS.labels(name)  # exported at 0 before any error

    def collect(self) -> Iterator[Metric]:
        try:
            found = list(self.read())
        except Exception:
            log.warning("metrics: could not read %s", self.name, exc_info=True)
            SCRAPE_ERRORS.labels(self.name).inc()
            _SOURCES_UP[self.name] = 0
            return iter(())
        _SOURCES_UP[self.name] = 1
        return iter(found)


_SOURCES_UP: dict[str, int] = {}


class SourcesUp:
    """``keel_metrics_source_up``: whether each source was read in this scrape. What alerts
    use: the error counter is per web process, and scrapes that alternate between processes
    would read its differences as counter resets."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "keel_metrics_source_up",
            "1 if this scrape read the source, 0 if its series are missing",
            labels=["source"],
        )
        for name, up in sorted(_SOURCES_UP.items()):
            family.add_metric([name], up)
        yield family


class ServesSystemWide:
    """``keel_metrics_system_wide``: whether this scrape served the system-wide series
    (``web.metrics_lease``); a ``sum`` over the targets is 1 when exactly one serves them."""

    def __init__(self) -> None:
        self.now = True

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "keel_metrics_system_wide",
            "1 if this scrape served the system-wide series, 0 if another server serves them"
            " (KEEL_METRICS_SCRAPE=each)",
        )
        family.add_metric([], int(self.now))
        yield family


# The system-wide series: served by every server, or by the one elected (web.metrics_lease)
SYSTEM_WIDE = CollectorRegistry()
SYSTEM_WIDE.register(Source("postgres", job_states))
SYSTEM_WIDE.register(Source("redis", lambda: chain(job_activity(), http_requests())))
SYSTEM_WIDE.register(Source("liveness", processes))
SYSTEM_WIDE.register(SourcesUp())  # after the sources: this scrape's outcome
# This server's own series, in every scrape
SERVED = ServesSystemWide()
OWN = CollectorRegistry()
OWN.register(SERVED)
OWN.register(SCRAPE_ERRORS)  # last: a scrape's own errors are in its answer


def exposition() -> bytes:
    """What ``/metrics`` answers: the system-wide series if this server serves them, then
    its own."""
    SERVED.now = metrics_lease.serves_system_wide()
    system_wide = generate_latest(SYSTEM_WIDE) if SERVED.now else b""
    return system_wide + generate_latest(OWN)


STACK_HEADER = "Keel-Stack"


@operation(bp, "/healthz", "GET", summary="Liveness", responses={200: Health}, authenticated=False)
def healthz():
    return {"status": "ok"}


@operation(
    bp,
    "/readyz",
    "GET",
    summary="Readiness of this API to accept work: Postgres answers (Redis and RabbitMQ are "
    "reported, not required: jobs added meanwhile are parked), answered within ~2 s",
    responses={200: Readiness, 503: None},
    authenticated=False,
)
def readyz():
    checks = health.readiness()
    failing = [check for check in checks if not check.ok and check.required]
    if failing:
        raise ApiError(
            503,
            f"not ready: {', '.join(check.name for check in failing)}",
            code="not_ready",
            details=[{"check": check.name, "problem": check.problem} for check in failing],
            headers={"Retry-After": "2"},
        )
    answer = {"status": "ready", "checks": {check.name: check.describe() for check in checks}}
    # `keel up` started this app with its stack's id: its probe knows its own API by it.
    stack_id = get_settings().stack_id
    return (answer, 200, {STACK_HEADER: stack_id}) if stack_id else answer


# The system-wide views (every tenant's figures, workers' and beat's host names) are read
# with the metrics token, monitoring's, or the `keel` command: never with a tenant's token,
# an operator's included (docs/tenants.md).


def metrics_token() -> bool:
    """The metrics token (Prometheus's, monitoring's), compared in constant time."""
    token = get_settings().metrics_token
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _scraper() -> bool:
    """The metrics token; anyone if the metrics are public."""
    return get_settings().metrics_public or metrics_token()


@operation(
    bp,
    "/api/v1/system/status",
    "GET",
    summary="The whole system: servers, workers' and beat's heartbeats, dead letters, overdue "
    "delayed jobs (as `keel status`); 200 whatever it finds, `healthy` says. With the "
    "`KEEL_METRICS_TOKEN` as bearer token only (a tenant's token, an operator's too, is 403)",
    responses={200: SystemStatus},
    admits=metrics_token,
    tenants=False,
)
def system_status():
    checks = health.system()
    return {
        "healthy": all(check.ok for check in checks),
        "checks": {
            check.name: {"ok": check.ok, "found": check.found, "problem": check.problem}
            for check in checks
        },
    }


@operation(
    bp,
    "/metrics",
    "GET",
    summary="Prometheus metrics, system-wide: with the `KEEL_METRICS_TOKEN` as bearer token (a "
    "tenant's token, an operator's too, is 403); open to anyone only with "
    "`KEEL_METRICS_PUBLIC=1`",
    responses={200: None},
    admits=_scraper,
    tenants=False,
    public_when=lambda: get_settings().metrics_public,
    produces="text/plain",
)
def metrics():
    return Response(exposition(), mimetype=CONTENT_TYPE_LATEST)


@operation(
    bp,
    "/api/v1/openapi.json",
    "GET",
    summary="This API's OpenAPI description",
    responses={200: Open},
    authenticated=False,
)
def openapi():
    return document()
