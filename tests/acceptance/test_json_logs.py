"""``keel up`` with ``KEEL_LOG_FORMAT=json`` and ``OTEL_TRACES_EXPORTER=console``: one JSON
object per line, from every process — log lines and spans — and a job followed across the
web app and the worker by its id and its trace."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.support.keel_up import KeelUp, clean_env
from tests.support.stack import wait_for

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def json_up(tmp_path_factory):
    home = tmp_path_factory.mktemp("json-up") / "home"
    env = {
        **clean_env(home),
        "KEEL_LOG_FORMAT": "json",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "KEEL_FAULT_INJECTION": "1",
    }
    up = KeelUp(home, env=env).start()
    yield up
    if up.process is not None and up.process.poll() is None:
        up.stop(signal.SIGINT)


def spans_of(log: str) -> list[dict]:
    """The console exporter's lines: one span each (``context`` holds its ids)."""
    found = []
    for line in log.splitlines():
        record = json.loads(line) if line.startswith("{") else None
        if isinstance(record, dict) and "context" in record and "name" in record:
            found.append(record)
    return found


def test_a_delayed_report_retried_twice_is_one_trace_in_the_console_spans(json_up: KeelUp):
    auth = {"Authorization": f"Bearer {json_up.token()}"}
    run_at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    body = {"reportId": "traced", "rows": 3, "runAt": run_at, "failUntilAttempt": 2}
    added = requests.post(
        f"{json_up.web}/api/v1/reports/scheduled", json=body, headers=auth, timeout=10
    )
    assert added.status_code == 202, added.text
    job_id = added.json()["jobId"]

    def traced() -> list[dict] | None:
        spans = spans_of(json_up.log())
        added = [s for s in spans if s["name"] == "keel.add"]
        [add] = [s for s in added if s["attributes"].get("keel.job.id") == job_id] or [None]
        if add is None:
            return None
        trace = [s for s in spans if s["context"]["trace_id"] == add["context"]["trace_id"]]
        names = [s["name"] for s in trace]
        done = names.count("keel.finish") == 3 and names.count("run/report.generate") == 3
        return trace if done else None

    trace = wait_for(traced, timeout=90, interval=0.5)
    names = [s["name"] for s in trace]
    services = {s["resource"]["attributes"]["service.name"] for s in trace}
    assert services == {"keel-web", "keel-worker"}, services
    assert names.count("run/report.generate") == 3 and names.count("keel.claim") == 3
    [root] = [s for s in trace if s["parent_id"] is None]
    assert root["kind"] == "SpanKind.SERVER" and root["attributes"]["http.route"] == (
        "/api/v1/reports/scheduled"
    )
    ends = [s["attributes"]["keel.job.end"] for s in trace if s["name"] == "keel.finish"]
    assert sorted(ends) == ["completed", "failed", "failed"]


def test_every_line_is_json_and_a_jobs_lines_share_its_id(json_up: KeelUp):
    token = json_up.token()
    auth = {"Authorization": f"Bearer {token}"}
    added = requests.post(
        f"{json_up.web}/api/v1/reports",
        json={"reportId": "json-logs", "rows": 3},
        headers={**auth, "X-Request-ID": "trace-me-1"},
        timeout=10,
    )
    assert added.status_code == 202, added.text
    job_id = added.json()["jobId"]

    def state() -> str:
        url = f"{json_up.web}/api/v1/reports/jobs/{job_id}"
        return requests.get(url, headers=auth, timeout=10).json()["state"]

    wait_for(lambda: state() == "completed", timeout=60, interval=0.5)
    json_up.stop(signal.SIGINT)  # every child has written its last line

    log = json_up.log()
    records = []
    for number, line in enumerate(log.splitlines(), 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"line {number} is not JSON: {line!r}")
    assert all(isinstance(r, dict) for r in records)
    spans = [r for r in records if "context" in r]
    records = [r for r in records if "context" not in r]  # log lines
    assert all("process" in r and "message" in r for r in records)
    assert {"web", "worker", "beat", "keel"} <= {r["process"] for r in records}
    # The job's lines: the web app's access line, and the worker's own line about it
    web = [r for r in records if r["process"] == "web" and r.get("job_id") == job_id]
    worker = [r for r in records if r["process"] == "worker" and r.get("job_id") == job_id]
    posted = [r for r in web if r["method"] == "POST"]
    assert [(r["route"], r["status"], r["request_id"], r["tenant_id"]) for r in posted] == [
        ("/api/v1/reports", 202, "trace-me-1", "acme")  # the caller's X-Request-ID, kept
    ]
    assert {r["route"] for r in web} == {"/api/v1/reports", "/api/v1/reports/jobs/<job_id>"}
    stored = [r for r in worker if r["message"].startswith("report json-logs: 3 rows")]
    assert len(stored) == 1, worker
    assert stored[0]["job_name"] == "report.generate" and stored[0]["tenant_id"] == "acme"
    assert (stored[0]["queue"], stored[0]["attempt"]) == ("reports", 1)
    # and the same trace: the POST's access line, the worker's line, the job's spans
    trace_ids = {posted[0]["trace_id"], stored[0]["trace_id"]}
    assert len(trace_ids) == 1, (posted, stored)
    [trace_id] = trace_ids
    in_trace = {s["name"] for s in spans if s["context"]["trace_id"] == "0x" + trace_id}
    assert {"keel.add", "run/report.generate", "keel.handler"} <= in_trace, in_trace
    # And nothing secret reached the output
    secret = json_up.stack_env["KEEL_SECRET_KEY"]
    assert token not in log and secret not in log
    assert token.split(".")[2] not in log  # not even the signature alone
