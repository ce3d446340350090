"""Traces across the API, the record and the workers, as an APM receives them over OTLP.

A gunicorn API and a celery worker run with ``OTEL_TRACES_EXPORTER=otlp`` towards a
receiver in this test (``tests.support.otlp``), on a database and a Redis database of
their own (so that the session's untraced worker takes none of their jobs). What a
job does between its request and its end must be one trace: a delayed job and a
retried one are published later by a worker's promoter, which knows nothing of the
request, and a chain's next step is sent by the previous step's run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
import requests

from tasks.platform.config import reload_settings
from tests.support.client import bearer, unique, wait_state
from tests.support.databases import fresh_database
from tests.support.otlp import Receiver, Span, ancestors
from tests.support.stack import WebProcess, WorkerProcess, wait_for

pytestmark = pytest.mark.stack  # starts processes of its own

REDIS_DB = 9
OWNER = ("acme", "tracer")


@dataclass
class Traced:
    receiver: Receiver
    web: WebProcess
    worker: WorkerProcess

    def post(self, path: str, body: dict) -> dict:
        response = requests.post(self.web.url + path, json=body, headers=bearer(*OWNER), timeout=10)
        assert response.status_code == 202, response.text
        return response.json()

    def trace_of_job(self, job_id: str, complete: callable) -> list[Span]:
        """The spans of the trace whose ``keel.add`` added ``job_id``, once ``complete`` and
        connected: every span's parent received too. Each process exports its spans in its
        own batches, so a run's span can arrive before the publish span between it and the
        run that sent it."""

        def found() -> list[Span] | None:
            spans = self.receiver.snapshot()
            added = [s for s in spans if s.attributes.get("keel.job.id") == job_id]
            added = [s for s in added if s.name == "keel.add"]
            if not added:
                return None
            trace = [s for s in spans if s.trace_id == added[0].trace_id]
            ids = {s.span_id for s in trace}
            connected = all(not s.parent_id or s.parent_id in ids for s in trace)
            return trace if connected and complete(trace) else None

        return wait_for(found, timeout=30, interval=0.2)


def _redis_url(db: int) -> str:
    parts = urlsplit(os.environ["KEEL_REDIS_URL"])
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture(scope="module")
def traced(stack) -> Iterator[Traced]:
    receiver = Receiver().start()
    redis.Redis.from_url(_redis_url(REDIS_DB)).flushdb()
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "KEEL_REDIS_URL": _redis_url(REDIS_DB),
        "KEEL_JOB_MODULES": "tests.support.jobs",
        "KEEL_LOG_FORMAT": "json",
        # A tenant's job and the chain it sends run side by side here: the tenant's running
        # cap (half this lone worker's 2 slots) would park deliveries, each one more span.
        "KEEL_TENANT_QUOTAS": '{"maxRunning": 100, "maxRunningPerQueue": 100, "systemReserve": 0}',
    }
    with fresh_database(), pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        reload_settings()
        web = WebProcess(stack.home)
        worker = WorkerProcess(stack.home, unique("traced"), concurrency=2)
        try:
            web.start()
            worker.start()
            yield Traced(receiver, web, worker)
        finally:
            worker.stop()
            web.stop()
            receiver.stop()
    reload_settings()


def _named(spans: list[Span], name: str) -> list[Span]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_ns)


def _has_ancestor(span: Span, spans: list[Span], wanted: Span) -> bool:
    return wanted in ancestors(span, {s.span_id: s for s in spans})


def test_a_delayed_report_retried_twice_is_one_trace_from_its_post_to_its_third_run(traced):
    # Given a report scheduled 2 s ahead whose first two runs fail
    run_at = datetime.now(UTC) + timedelta(seconds=2)
    body = {"reportId": unique(), "rows": 3, "runAt": run_at.isoformat(), "failUntilAttempt": 2}
    job_id = traced.post("/api/v1/reports/scheduled", body)["jobId"]
    # When it has run three times and completed
    job = wait_state(job_id, "completed", "failed", timeout=60)
    assert job["state"] == "completed" and job["attemptsStarted"] == 3, job
    spans = traced.trace_of_job(
        job_id,
        lambda trace: (
            [s.name for s in trace].count("keel.finish") == 3
            and [s.name for s in trace].count("run/report.generate") == 3
        ),
    )
    by_id = {s.span_id: s for s in spans}

    # Then the trace starts at the POST, on the API
    [root] = [s for s in spans if not s.parent_id]
    assert root.kind == "server" and root.service == "keel-web", root
    assert root.attributes.get("http.route") == "/api/v1/reports/scheduled", root.attributes
    [added] = _named(spans, "keel.add")
    assert _has_ancestor(added, spans, root)
    # and holds the record's insert (a statement span under the add)
    statements = [s for s in spans if s.attributes.get("db.system") == "postgresql"]
    assert any(_has_ancestor(s, spans, added) for s in statements), statements
    # and three publishes by the promoter, each in the add's trace, each waking one run
    publishes = _named(spans, "apply_async/report.generate")
    runs = _named(spans, "run/report.generate")
    assert len(publishes) == 3 and len(runs) == 3, [s.name for s in spans]
    assert all(p.service == "keel-worker" and by_id[p.parent_id] is added for p in publishes)
    assert [by_id[r.parent_id] for r in runs] == publishes
    # and each run claims, runs the handler and records its end: two failures, one success
    claims, handlers, finishes = (
        _named(spans, n) for n in ("keel.claim", "keel.handler", "keel.finish")
    )
    assert [c.attributes["keel.job.attempt"] for c in claims] == [1, 2, 3]
    assert [by_id[c.parent_id] for c in claims] == runs
    assert [h.status for h in handlers] == [2, 2, 0], handlers  # ERROR, ERROR, UNSET
    assert [f.attributes["keel.job.end"] for f in finishes] == ["failed", "failed", "completed"]
    assert [f.attributes.get("keel.job.retrying") for f in finishes[:2]] == [True, True]
    # and the runs' statements and Redis calls are in it too
    assert any(_has_ancestor(s, spans, claims[0]) for s in statements)
    assert any(s.attributes.get("db.system") == "redis" for s in spans)
    # and the runs were not early: the first waited out the delay
    assert runs[0].start_ns >= int(run_at.timestamp() * 1e9) - 50_000_000

    # and the API's and the worker's log lines of the job carry its trace id
    for process in (traced.web, traced.worker):
        text = process.log_path.read_text().splitlines()
        lines = [json.loads(line) for line in text if line.startswith("{")]  # (a banner is not)
        of_job = [line for line in lines if line.get("job_id") == job_id]
        assert of_job and {line.get("trace_id") for line in of_job} == {root.trace_id}, of_job


def test_a_chain_sent_by_a_job_is_in_the_jobs_trace_each_step_under_the_previous(traced):
    # Given a job, submitted over HTTP, that sends a chain of three steps as it runs, the
    # last of which retries once (its second run published later, by a promoter)
    job_id = traced.post("/api/v1/jobs", {"name": "test.chain_of_three", "data": {}})["jobId"]
    job = wait_state(job_id, "completed", "failed", timeout=30)
    first, second, third = job["result"]["steps"]
    assert wait_state(second, "completed", "failed", timeout=30)["result"] == 6
    last = wait_state(third, "completed", "failed", timeout=30)
    assert last["state"] == "completed" and last["attemptsStarted"] == 2, last
    # When the trace of the submission is read
    spans = traced.trace_of_job(
        job_id,
        lambda trace: (
            len([s for s in trace if s.name == "run/test.celery_add"]) == 2
            and len([s for s in trace if s.name == "run/test.celery_retry"]) == 2
        ),
    )
    # Then both steps' runs are in it, the second under the first (its run sent it)
    claims: dict[str, list[Span]] = {}
    for claim in _named(spans, "keel.claim"):
        claims.setdefault(claim.attributes.get("keel.job.id"), []).append(claim)
    by_id = {s.span_id: s for s in spans}
    first_run, second_run = (by_id[claims[step][0].parent_id] for step in (first, second))
    assert _has_ancestor(second_run, spans, first_run)
    # and the first step under the job's run, which sent the chain
    job_run = by_id[claims[job_id][0].parent_id]
    assert _has_ancestor(first_run, spans, job_run)
    # and the last step's two runs under the second step's run, which recorded it: the
    # retry, published by a promoter that knew nothing of the chain, too
    retry_runs = [by_id[c.parent_id] for c in claims[third]]
    assert len(retry_runs) == 2
    assert all(_has_ancestor(run, spans, second_run) for run in retry_runs), retry_runs
