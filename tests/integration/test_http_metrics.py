"""The API's request durations in /metrics: by method, route template and status, counted
in each process and added up in Redis (``web.http_metrics``)."""

from __future__ import annotations

import os
import re

import redis

from tasks.platform import tallies
from tests.support.client import bearer, metrics_headers, unique
from web import http_metrics


def samples(client) -> dict[str, float]:
    exposed = client.get("/metrics", headers=metrics_headers()).get_data(as_text=True)
    found = {}
    for line in exposed.splitlines():
        if line.startswith("keel_http_request_duration_seconds"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def count(found: dict[str, float], method: str, route: str, status: int) -> float:
    labels = f'method="{method}",route="{route}",status="{status}"'
    return found.get(f"keel_http_request_duration_seconds_count{{{labels}}}", 0.0)


def test_requests_are_counted_by_route_template_and_status(client):
    http_metrics.RECORDER.flush()
    before = samples(client)
    # When a report is posted, two unknown jobs are read, and a path matches no route
    posted = client.post(
        "/api/v1/reports", headers=bearer(), json={"reportId": unique(), "rows": 2}
    )
    assert posted.status_code == 202
    for _ in range(2):
        job_id = unique("nojob")
        assert client.get(f"/api/v1/jobs/{job_id}", headers=bearer()).status_code == 404
    assert client.get(f"/no/such/{unique()}").status_code == 404
    http_metrics.RECORDER.flush()  # (each process's thread does it every few seconds)
    after = samples(client)
    # Then each is counted once under its route's template, never its path
    assert (
        count(after, "POST", "/api/v1/reports", 202)
        == count(before, "POST", "/api/v1/reports", 202) + 1
    )
    assert (
        count(after, "GET", "/api/v1/jobs/<job_id>", 404)
        == count(before, "GET", "/api/v1/jobs/<job_id>", 404) + 2
    )
    assert count(after, "GET", "<unmatched>", 404) == count(before, "GET", "<unmatched>", 404) + 1
    assert not [name for name in after if "nojob-" in name or "/no/such" in name]
    # and the buckets are cumulative, ending at the count
    labels = 'method="POST",route="/api/v1/reports",status="202"'
    bucket = re.compile(rf'keel_http_request_duration_seconds_bucket\{{le="[^"]+",{labels}\}}')
    buckets = [value for name, value in after.items() if bucket.fullmatch(name)]
    assert len(buckets) == len(http_metrics.BUCKETS) + 1 and buckets == sorted(buckets)
    assert buckets[-1] == count(after, "POST", "/api/v1/reports", 202)


def test_counts_wait_in_memory_while_redis_is_away_and_are_added_once(stack, monkeypatch):
    recorder = http_metrics.Recorder()
    route = f"/test/{unique('route')}"
    recorder.observe("GET", route, 200, 0.02)
    recorder.observe("GET", route, 200, 3.0)
    # When Redis cannot be reached at the flush
    away = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    monkeypatch.setattr(tallies, "redis_client", lambda: away)
    assert recorder.flush() is False
    recorder.observe("GET", route, 200, 0.02)
    # Then the next flush, with Redis back, adds all three, once
    monkeypatch.undo()
    assert recorder.flush() is True and recorder.flush() is True
    found = http_metrics.snapshot()[("GET", route, "200")]
    assert found == {"0.025": 2.0, "5.0": 1.0, "count": 3.0, "sum": 3.04}


class LostReply(redis.Redis):
    """The real Redis, whose reply to a script is lost on the way back (a timeout after the
    server had applied it): what a flush cannot tell from a flush that never arrived."""

    def execute_command(self, *args, **options):
        reply = super().execute_command(*args, **options)
        if args[0] == "EVAL":
            raise redis.TimeoutError("reply lost")
        return reply


def test_a_flush_sent_again_after_its_reply_was_lost_counts_once(stack, monkeypatch):
    recorder = http_metrics.Recorder()
    route = f"/test/{unique('route')}"
    recorder.observe("POST", route, 202, 0.02)
    # When the flush is applied but its reply lost
    lost = LostReply.from_url(os.environ["KEEL_REDIS_URL"])
    monkeypatch.setattr(tallies, "redis_client", lambda: lost)
    assert recorder.flush() is False
    assert http_metrics.snapshot()[("POST", route, "202")]["count"] == 1.0  # it did arrive
    recorder.observe("POST", route, 202, 0.3)  # and a request comes meanwhile
    # Then the flush sent again is not counted again; the later request is, once
    monkeypatch.undo()
    assert recorder.flush() is True and recorder.flush() is True
    found = http_metrics.snapshot()[("POST", route, "202")]
    assert found == {"0.025": 1.0, "0.5": 1.0, "count": 2.0, "sum": 0.32}
    # and a graceful exit forgets the process's flush number
    client = redis.Redis.from_url(os.environ["KEEL_REDIS_URL"])
    assert client.hexists(http_metrics.APPLIED_KEY, recorder.process)
    recorder.close()
    assert not client.hexists(http_metrics.APPLIED_KEY, recorder.process)
