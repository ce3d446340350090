"""Run-time histograms by job name, in Redis, as every worker process records them and
``/metrics`` reads them; observations an older release made (without a name) still count."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from tasks.jobs.observe import metrics
from tasks.platform.broker import redis_client
from tests.support.client import unique
from web import system


def test_durations_are_kept_per_job_name_and_old_observations_under_an_empty_one(
    stack, monkeypatch
):
    queue = unique("hist")
    # Given one observation as the previous release wrote it (fields without a job name)
    key = metrics.histogram_key(queue, "duration")
    redis_client().hset(key, mapping={"0.1": 1, "sum": 0.08, "count": 1})
    # and three of two job types now
    metrics.observe(queue, "duration", 0.3, "mail.send")
    metrics.observe(queue, "duration", 4.0, "mail.send")
    metrics.observe(queue, "duration", 0.01, "report.generate")
    # When they are read back, once this process has sent them (every second, or now)
    assert metrics.flush() is True
    found = metrics.snapshot([queue])[queue]["duration"]
    # Then each job name has its own buckets, sum and count
    assert found["mail.send"] == {"0.5": 1.0, "5.0": 1.0, "sum": 4.3, "count": 2.0}
    assert found["report.generate"] == {"0.05": 1.0, "sum": 0.01, "count": 1.0}
    assert found[""] == {"0.1": 1.0, "sum": 0.08, "count": 1.0}
    # and /metrics shows them as cumulative histograms labelled by queue and job name
    monkeypatch.setattr(system, "known_queues", lambda: [queue])
    registry = CollectorRegistry()
    registry.register(system.Source("redis", system.job_activity))
    exposed = generate_latest(registry).decode()
    at = f'job_name="mail.send",le="1.0",queue="{queue}"'
    assert f"keel_job_duration_seconds_bucket{{{at}}} 1.0" in exposed
    at = f'job_name="mail.send",le="+Inf",queue="{queue}"'
    assert f"keel_job_duration_seconds_bucket{{{at}}} 2.0" in exposed
    assert f'keel_job_duration_seconds_count{{job_name="",queue="{queue}"}} 1.0' in exposed
