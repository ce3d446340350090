"""Liveness, readiness, metrics and the API description."""

from __future__ import annotations

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from tasks import health
from tasks.celeryconfig import QUEUES
from tasks.jobs.model import registry
from tasks.jobs.observe import metrics as job_metrics
from tasks.jobs.store.counts import counts
from web.api import operation
from web.auth import OPERATOR
from web.errors import ApiError
from web.openapi import document
from web.schemas import Health, Open, Readiness, SystemStatus

bp = Blueprint("system", __name__)


def known_queues() -> list[str]:
    """Every queue a loaded job type runs on (your modules' too), and Celery's declared ones."""
    return sorted(set(QUEUES) | set(registry.queues()))


class JobStateCollector:
    """Jobs by queue and state, read from the records at scrape time."""

    def collect(self):
        family = GaugeMetricFamily(
            "keel_jobs", "Job records by queue and state", labels=["queue", "state"]
        )
        for queue in known_queues():
            for state, n in counts(queue).items():
                family.add_metric([queue, state], n)
        yield family


class JobActivityCollector:
    """Event counters and run histograms every worker process records in Redis."""

    def collect(self):
        events = CounterMetricFamily(
            "keel_job_events",
            "Queue events by type (failed, retrying, deduplicated, stalled, ...)",
            labels=["queue", "event"],
        )
        families = {
            "duration": HistogramMetricFamily(
                "keel_job_duration_seconds", "Run time of finished runs", labels=["queue"]
            ),
            "wait": HistogramMetricFamily(
                "keel_job_wait_seconds", "Time from due to start", labels=["queue"]
            ),
        }
        for queue, found in job_metrics.snapshot(known_queues()).items():
            for event, n in found["events"].items():
                events.add_metric([queue, event], n)
            for kind, family in families.items():
                buckets, total = _cumulative(found[kind])
                family.add_metric([queue], buckets, sum_value=total)
        yield events
        yield from families.values()


def _cumulative(histogram: dict[str, float]) -> tuple[list[tuple[str, float]], float]:
    running, buckets = 0.0, []
    for bound in [*map(str, job_metrics.BUCKETS), "+Inf"]:
        running += histogram.get(bound, 0.0)
        buckets.append((bound, running))
    return buckets, histogram.get("sum", 0.0)


REGISTRY = CollectorRegistry()
REGISTRY.register(JobStateCollector())
REGISTRY.register(JobActivityCollector())


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
    return {"status": "ready", "checks": {check.name: check.describe() for check in checks}}


@operation(
    bp,
    "/api/v1/system/status",
    "GET",
    summary="The whole system: servers, workers' and beat's heartbeats, dead letters, overdue "
    "delayed jobs (as `keel status`); 200 whatever it finds, `healthy` says",
    responses={200: SystemStatus},
    role=OPERATOR,
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
    summary="Prometheus metrics",
    responses={200: None},
    authenticated=False,
    produces="text/plain",
)
def metrics():
    return Response(generate_latest(REGISTRY), mimetype=CONTENT_TYPE_LATEST)


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
