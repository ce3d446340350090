"""Keel's connections to Postgres over TLS, verified (``sslmode=verify-full`` with
``sslrootcert`` in ``KEEL_DATABASE_URL``: libpq's own parameters, which Keel passes on).

The TLS endpoint is Debian's PgBouncer in front of the suite's Postgres, with a server
certificate for 127.0.0.1 issued by a certificate authority the test makes
(``client_tls_sslmode = require``: it refuses a client that does not speak TLS). A
worker and a producer process on that URL run a job; a client that trusts another
authority is refused by its own libpq, with the TLS error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from keel.embedded.postgres_server import server_launch
from tests.support.client import unique, wait_state
from tests.support.pgbouncer import PgBouncer
from tests.support.redis_tls import issue, make_authority
from tests.support.stack import PROJECT_ROOT, WorkerProcess

pytestmark = pytest.mark.stack  # starts PgBouncer and a worker of its own

QUEUE = unique("pgtls")

ADD = """
import json
from tasks.jobs import add

added = add("test.echo", {"over": "tls"}, queue=%r)
print(json.dumps({"jobId": added.job_id}))
"""


def readable_by_the_server(*paths) -> None:
    """PgBouncer reads its key as whoever it runs as: as root, the embedded Postgres's
    account when it switches to it (in a user namespace it stays root's, on the host)."""
    launch = server_launch()
    if launch.account is not None:
        for path in paths:
            os.chown(path, launch.uid, launch.gid)


@pytest.fixture(scope="module")
def tls_bouncer(stack, tmp_path_factory) -> Iterator[tuple[PgBouncer, str, str]]:
    """PgBouncer speaking TLS only, and the URL parameters of a client trusting its CA and
    of one trusting another CA."""
    home = stack.home / "pgbouncer-tls"
    home.mkdir(parents=True, exist_ok=True)
    authority = make_authority(home, "keel-test-postgres-ca")
    server = issue(authority, home, "pgbouncer", server=True)
    stranger = make_authority(tmp_path_factory.mktemp("other-ca"), "another-ca")
    readable_by_the_server(server.cert, server.key)
    trusted = f"sslmode=verify-full&sslrootcert={authority.cert}"
    bouncer = PgBouncer(
        home,
        os.environ["KEEL_DATABASE_URL"],
        settings=[
            "client_tls_sslmode = require",
            f"client_tls_cert_file = {server.cert}",
            f"client_tls_key_file = {server.key}",
        ],
        probe_params=trusted,
    )
    bouncer.start()
    yield bouncer, trusted, f"sslmode=verify-full&sslrootcert={stranger.cert}"
    bouncer.stop()


def env_for(url: str) -> dict[str, str]:
    return {"KEEL_DATABASE_URL": url, "KEEL_DATABASE_POOLER": "transaction"}


def test_a_worker_and_a_producer_over_verified_tls_run_a_job(tls_bouncer, stack):
    bouncer, trusted, _other = tls_bouncer
    env = env_for(f"{bouncer.url}?{trusted}")
    worker = WorkerProcess(stack.home, unique("pgtls"), concurrency=1, queues=QUEUE, extra_env=env)
    worker.start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", ADD % QUEUE],
            cwd=PROJECT_ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        job_id = json.loads(done.stdout.strip().splitlines()[-1])["jobId"]
        # (read here on the suite's own connection: the same database)
        finished = wait_state(job_id, "completed", "failed", timeout=30)
        assert finished["result"] == {"echo": {"over": "tls"}}, finished
    finally:
        worker.stop()


def test_a_client_that_trusts_another_authority_is_refused_with_the_tls_error(tls_bouncer):
    bouncer, _trusted, other = tls_bouncer
    done = subprocess.run(
        [sys.executable, "-c", ADD % QUEUE],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env_for(f"{bouncer.url}?{other}")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "certificate verify failed" in done.stderr, done.stderr[-2000:]
