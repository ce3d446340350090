"""What ``GET /readyz`` checks: Postgres, Redis, RabbitMQ if it is the broker, a worker heartbeat.

Each check runs in a small thread pool and the probe waits for all of them
together for at most ``DEADLINE_S``, so ``/readyz`` answers in about that
time even when a server accepts connections but never replies (a stopped
process, a full disk). A check still running from an earlier probe is
joined, not started again: a hung server ties up one thread per check, not
one per probe. Postgres is checked on a connection of its own, not the
request pool, so a probe never waits behind requests (nor holds their
connections while Postgres hangs).

Problems are named by check and by exception class only: the probe is
unauthenticated, and driver messages carry socket paths and hosts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import psycopg
from sqlalchemy.engine import make_url

from tasks.celery import app
from tasks.config import get_settings
from tasks.jobs import liveness

log = logging.getLogger(__name__)

DEADLINE_S = 1.5
POSTGRES_CONNECT_TIMEOUT_S = 2  # libpq's minimum; the probe's deadline still applies

_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="keel-readyz")
_running: dict[str, Future] = {}
_guard = threading.Lock()


@dataclass(frozen=True)
class Check:
    """One part of readiness and what is wrong with it (``None``: nothing)."""

    name: str
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _postgres() -> str | None:
    url = make_url(get_settings().sqlalchemy_url).set(drivername="postgresql")
    with psycopg.connect(
        url.render_as_string(hide_password=False),
        connect_timeout=POSTGRES_CONNECT_TIMEOUT_S,
        options="-c statement_timeout=1000",
    ) as conn:
        conn.execute("SELECT 1")
    return None


def _redis() -> str | None:
    liveness.quick_client().ping()
    return None


def _rabbitmq() -> str | None:
    """An AMQP handshake, on a connection of its own (not the publishers' pool)."""
    with app.connection_for_write() as connection:  # Keel's transport, TLS, connect timeout
        connection.ensure_connection(max_retries=0)
    return None


def _workers() -> str | None:
    seen = liveness.fresh(liveness.quick_client(), "worker")
    return None if seen else f"no worker heartbeat in the last {liveness.FRESH_S:.0f} s"


def checks() -> dict[str, Callable[[], str | None]]:
    """The checks for this configuration: RabbitMQ's only when it carries Celery's messages."""
    found: dict[str, Callable[[], str | None]] = {"postgres": _postgres, "redis": _redis}
    if get_settings().broker_on_amqp:
        found["rabbitmq"] = _rabbitmq
    found["workers"] = _workers
    return found


def _submit(name: str, check: Callable[[], str | None]) -> Future:
    with _guard:
        running = _running.get(name)
        if running is None or running.done():
            running = _running[name] = _pool.submit(check)
        return running


def check_all(deadline_s: float = DEADLINE_S) -> list[Check]:
    """Every check, each answered or given up on within ``deadline_s`` of the call."""
    futures = {name: _submit(name, check) for name, check in checks().items()}
    until = time.monotonic() + deadline_s
    results = []
    for name, future in futures.items():
        try:
            problem = future.result(timeout=max(0.0, until - time.monotonic()))
        except FutureTimeout:
            problem = f"no answer within {deadline_s:g} s"
        except Exception as exc:
            log.warning("readiness check %s failed: %s", name, exc)
            problem = f"unavailable ({type(exc).__name__})"
        results.append(Check(name, problem))
    return results
