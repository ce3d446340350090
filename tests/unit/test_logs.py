"""Keel's log lines (``tasks.platform.logs``): JSON and text, the job's and request's fields,
redaction."""

from __future__ import annotations

import io
import json
import logging

import pytest
from celery import Celery

from tasks.platform import logs

SECRET = "test-secret-key-for-keel-suite-0123456789"  # the suite's KEEL_SECRET_KEY
TOKEN = "eyJhbGciOiJIUzUxMiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"


@pytest.fixture
def lines():
    """A logger whose records land in a buffer, formatted by ``kind``; restores the root."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logs._role["name"], logging.getLogRecordFactory())

    def configure(kind: str, role: str = "worker") -> tuple[logging.Logger, io.StringIO]:
        buffer = io.StringIO()
        logs.configure(role, stream=buffer)
        root.handlers[0].setFormatter(logs.formatter(kind))
        return logging.getLogger("tests.logs"), buffer

    yield configure
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logs._role["name"] = saved[2]
    logging.setLogRecordFactory(saved[3])
    logging.captureWarnings(False)


def test_a_json_line_has_the_named_fields_and_the_extras(lines):
    log, buffer = lines("json", role="web")
    log.info("added %s", "job-1", extra={"route": "/api/v1/jobs", "status": 202})
    [line] = buffer.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "added job-1"
    assert (record["level"], record["logger"], record["process"]) == ("INFO", "tests.logs", "web")
    assert record["time"].endswith("+00:00") and isinstance(record["pid"], int)
    assert (record["route"], record["status"]) == ("/api/v1/jobs", 202)


def test_a_traceback_stays_in_its_one_json_line(lines):
    log, buffer = lines("json")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    [line] = buffer.getvalue().splitlines()
    record = json.loads(line)
    assert "ValueError: boom" in record["exc_info"] and "Traceback" in record["exc_info"]


def test_a_text_line_is_celerys_with_the_fields_after_it(lines):
    log, buffer = lines("text")
    with logs.bind(request_id="req-7", tenant_id="acme"):
        log.warning("slow answer")
    line = buffer.getvalue().strip()
    assert line.startswith("[") and "WARNING/MainProcess] slow answer" in line
    assert line.endswith("process=worker request_id=req-7 tenant_id=acme")


def test_bound_fields_last_for_their_block_only(lines):
    log, buffer = lines("json")
    with logs.bind(request_id="req-1") as fields:
        fields["tenant_id"] = "acme"  # the caller became known during the request
        log.info("inside")
    log.info("after")
    inside, after = (json.loads(line) for line in buffer.getvalue().splitlines())
    assert (inside["request_id"], inside["tenant_id"]) == ("req-1", "acme")
    assert "request_id" not in after and "tenant_id" not in after


def test_a_line_logged_while_a_task_runs_names_its_job(lines):
    log, buffer = lines("json")
    app = Celery("log-fields", set_as_current=False)

    @app.task(name="shop.confirm", bind=True)
    def confirm(self):
        log.info("confirming")

    confirm.push_request(id="job-42", retries=2, delivery_info={"routing_key": "shop"})
    from celery._state import _task_stack

    _task_stack.push(confirm)
    try:
        confirm.run()
    finally:
        _task_stack.pop()
        confirm.pop_request()
    record = json.loads(buffer.getvalue())
    assert {k: record[k] for k in ("job_id", "job_name", "queue", "attempt")} == {
        "job_id": "job-42",
        "job_name": "shop.confirm",
        "queue": "shop",
        "attempt": 3,  # two retries before: the third run
    }


@pytest.mark.parametrize("kind", ["json", "text"])
def test_no_token_secret_or_password_reaches_a_line(lines, kind):
    log, buffer = lines(kind)
    log.info("Authorization: Bearer %s", TOKEN)
    log.info("token %s in a message", TOKEN)
    log.warning("secret %s", SECRET, extra={"header": f"Bearer {TOKEN}"})
    log.error("cannot reach postgresql://keel:hunter2-pw@db:5432/keel")
    try:
        raise RuntimeError(f"key was {SECRET}")
    except RuntimeError:
        log.exception("failed")
    text = buffer.getvalue()
    for leaked in (TOKEN, SECRET, "hunter2-pw"):
        assert leaked not in text
    assert text.count("***") >= 5
    if kind == "json":
        assert all(json.loads(line) for line in text.splitlines())


def test_auto_is_text_on_a_terminal_and_json_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(logs.formatter("auto", Terminal()), logs.TextLines)
    assert isinstance(logs.formatter("auto", io.StringIO()), logs.JsonLines)


def test_a_servers_password_and_a_secret_json_escapes_are_masked_too(lines, monkeypatch):
    from tasks.platform.config import reload_settings

    odd = 'flower"pass\\word-1234'  # a quote and a backslash: JSON writes them escaped
    monkeypatch.setenv("KEEL_FLOWER_PASSWORD", odd)
    monkeypatch.setenv("KEEL_REDIS_URL", "redis://:s3cret-redis-pw@127.0.0.1:6379/0")
    # a password with an "@", percent-encoded in the URL: masked as written and as sent; and
    # one with "/" and "?" (SQLAlchemy reads it up to the "@", urllib finds none)
    monkeypatch.setenv("KEEL_DATABASE_URL", "postgresql://keel:pg%40secret-99@db:5432/keel")
    monkeypatch.setenv("KEEL_BROKER_URL", "amqp://keel:ab/cd?ef-secret@mq:5672//")
    reload_settings()
    try:
        log, buffer = lines("json")
        log.info("connecting to redis://:s3cret-redis-pw@127.0.0.1:6379/0")
        log.info("the password is %s", odd)
        log.info("again, without the URL: s3cret-redis-pw")
        log.info("as written: %s, as sent: %s", "pg%40secret-99", "pg@secret-99")
        log.info("the broker's: %s", "ab/cd?ef-secret")
        text = buffer.getvalue()
        assert "s3cret-redis-pw" not in text
        assert "pg%40secret-99" not in text and "pg@secret-99" not in text
        assert "ab/cd?ef-secret" not in text
        assert json.dumps(odd)[1:-1] not in text and odd not in text
        assert "redis://:***@127.0.0.1" in text
    finally:
        monkeypatch.undo()
        reload_settings()
