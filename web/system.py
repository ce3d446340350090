"""Liveness, metrics and the API description."""

from __future__ import annotations

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from tasks.celeryconfig import QUEUES
from tasks.jobs.counts import counts
from web.api import operation
from web.openapi import document
from web.schemas import Health, Open

bp = Blueprint("system", __name__)


class JobStateCollector:
    """Jobs by queue and state, read from the records at scrape time."""

    def collect(self):
        family = GaugeMetricFamily(
            "keel_jobs", "Job records by queue and state", labels=["queue", "state"]
        )
        for queue in QUEUES:
            for state, n in counts(queue).items():
                family.add_metric([queue, state], n)
        yield family


REGISTRY = CollectorRegistry()
REGISTRY.register(JobStateCollector())


@operation(bp, "/healthz", "GET", summary="Liveness", responses={200: Health}, authenticated=False)
def healthz():
    return {"status": "ok"}


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
