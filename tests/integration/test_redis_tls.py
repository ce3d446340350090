"""Keel on a Redis that speaks TLS only, to an ACL user, asking for a client certificate.

``KEEL_REDIS_URL=rediss://keel:PASSWORD@127.0.0.1:PORT/0?ssl_ca_certs=…&ssl_certfile=…&
ssl_keyfile=…`` drives Keel's own clients, Celery's broker and its result backend alike
(``tasks.platform.redis_url``): a worker runs a report added by another process, which
waits for it with ``AsyncResult.get()`` (the result backend's subscription, over TLS).
A worker given a CA that did not sign the server's certificate stops at start in one line
naming the host and the TLS error. The certificates are made by the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tasks.jobs.upkeep.broker_reset import EPOCH_KEY
from tests.support.client import unique
from tests.support.redis_tls import TlsRedis, make_authority
from tests.support.sentinel import program
from tests.support.stack import PROJECT_ROOT, WorkerProcess

pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(program("redis-server") is None, reason="needs Debian's redis-server"),
]
QUEUE = unique("tls")

# Another process: a report on QUEUE, waited for through Celery's result backend.
ADD_AND_WAIT = """
import json, sys
from tasks.celery import app
from tests.support.chaos import add_reports
[job_id] = add_reports(sys.argv[1], 1)
result = app.AsyncResult(job_id).get(timeout=60)
print(json.dumps({"id": job_id, "state": app.AsyncResult(job_id).state, "result": result}))
"""


@pytest.fixture(scope="module")
def server(stack, tmp_path_factory) -> Iterator[TlsRedis]:
    redis_server = TlsRedis(tmp_path_factory.mktemp("redis-tls"))
    redis_server.start()
    redis_server.client().set(EPOCH_KEY, "tls-test")  # as a deployed Redis has one
    yield redis_server
    redis_server.stop()


def test_a_report_completes_through_redis_over_tls_with_an_acl_user(server, tmp_path):
    env = {"KEEL_REDIS_URL": server.url(), "KEEL_REPORT_STEP_PAUSE_MS": "0"}
    worker = WorkerProcess(tmp_path, unique("tls"), concurrency=1, queues=QUEUE, extra_env=env)
    worker.start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", ADD_AND_WAIT, QUEUE],
            cwd=PROJECT_ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:] + worker.log_tail()
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["state"] == "SUCCESS", report
        assert report["result"]["generatedRows"] == 5 and not report["result"]["reused"], report
        # and the messages went through that Redis: the job's events are in its streams
        assert server.client().keys(f"*{QUEUE}*"), "nothing of the queue's in the TLS Redis"
    finally:
        worker.stop()


def test_a_wrong_ca_stops_a_worker_at_start_in_one_line(server, tmp_path):
    other = make_authority(tmp_path, "another ca")
    env = {**os.environ, "KEEL_REDIS_URL": server.url(ca=other.cert)}
    started = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", QUEUE, "-c", "1"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode != 0
    # (as root, Celery warns about it first: not Keel's)
    assert "Traceback" not in started.stderr, started.stderr
    # (Keel's lines start with "keel:"; a path in another line may hold the word too)
    said = [line for line in started.stderr.splitlines() if line.lower().startswith("keel")]
    assert len(said) == 1, started.stderr
    assert said[0].startswith("keel: cannot connect to Redis at 127.0.0.1 over TLS"), said
    assert "CERTIFICATE_VERIFY_FAILED" in said[0] and str(other.cert) in said[0], said
    assert server.password not in started.stderr + started.stdout
