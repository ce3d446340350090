"""Checks of Keel's parts, answered within a deadline: readiness and the system's status.

Two questions, two sets of checks:

- **Can this API accept work?** (``GET /readyz``, ``readiness``): Postgres
  must answer, because a job is its record. Redis, and RabbitMQ when it is
  the broker, are checked and reported but do not make the API unready: a
  job added while they are down is recorded and parked, and published when
  they are back. A missing worker does not either: the job waits.
- **Is the whole system well?** (``keel status``, ``GET /api/v1/system/status``,
  ``system``): the same servers, plus a fresh heartbeat from a worker and
  from beat, no worker whose consumer is wedged (it has consumed nothing,
  though it should, for ``liveness.WEDGED_S``, 60 s: ``tasks.jobs.run.slots``),
  no dead letters, and no delayed jobs long overdue (parked jobs that no
  promoter publishes, because no worker runs or the broker is down).

Each check runs in a small thread pool and the caller waits for all of them
together for at most the deadline, so an answer comes in about that time even
when a server accepts connections but never replies (a stopped process, a
full disk). A check still running from an earlier call is joined, not started
again: a hung server ties up one thread per check, not one per call. Postgres
is checked on a connection of its own, not the request pool, so a probe never
waits behind requests (nor holds their connections while Postgres hangs).

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
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from tasks.platform.config import get_settings

log = logging.getLogger(__name__)

DEADLINE_S = 1.5
POSTGRES_CONNECT_TIMEOUT_S = 2  # libpq's minimum; the probe's deadline still applies
OVERDUE_S = 60.0  # a delayed job due this long ago and still not published: nothing promotes it

# A check answers (problem or None, what it found); a problem makes it fail.
Finding = tuple[str | None, str]

_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="keel-health")
_running: dict[str, Future] = {}
_guard = threading.Lock()


@dataclass(frozen=True)
class Check:
    """One part and what is wrong with it (``problem`` None: nothing); ``found``: what it saw."""

    name: str
    problem: str | None
    found: str = "ok"
    required: bool = True  # for readiness: a failing check that is not required is only reported

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        return self.found if self.ok else f"{self.problem}"


def _postgres() -> Finding:
    settings = get_settings()
    url = make_url(settings.sqlalchemy_url).set(drivername="postgresql")
    # A transaction pooler refuses startup options; there the probe's own deadline suffices.
    options: dict[str, Any] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
    if settings.database_pooler != "transaction":
        options["options"] = "-c statement_timeout=1000"
    with psycopg.connect(url.render_as_string(hide_password=False), **options) as conn:
        conn.execute("SELECT 1")
    return None, "ok"


def _redis() -> Finding:
    from tasks.jobs.upkeep import liveness

    liveness.quick_client().ping()
    return None, "ok"


def _rabbitmq() -> Finding:
    """An AMQP handshake, on a connection of its own (not the publishers' pool)."""
    from tasks.platform.celery_app import app

    with app.connection_for_write() as connection:  # Keel's transport, TLS, connect timeout
        connection.ensure_connection(max_retries=0)
    return None, "ok"


def _heartbeats(role: str) -> Finding:
    from tasks.jobs.upkeep import liveness

    seen = liveness.fresh(liveness.quick_client(), role)
    if not seen:
        return f"no {role} heartbeat in the last {liveness.FRESH_S:.0f} s", "none"
    return None, f"{len(seen)} alive: {', '.join(seen)}"


def _workers() -> Finding:
    """Fresh worker heartbeats, none of them from a consumer wedged for ``liveness.WEDGED_S``."""
    from tasks.jobs.upkeep import liveness

    client = liveness.quick_client()
    seen = liveness.fresh(client, "worker")
    if not seen:
        return f"no worker heartbeat in the last {liveness.FRESH_S:.0f} s", "none"
    stuck = liveness.stuck(client, "worker", seen)
    wedged = {m: p for m in seen if (p := liveness.wedged(stuck.get(m))) is not None}
    found = f"{len(seen)} alive: {', '.join(seen)}"
    if wedged:
        listed = "; ".join(f"{member}: {problem}" for member, problem in sorted(wedged.items()))
        return listed, f"{found}; {len(wedged)} wedged"
    return None, found


def _beat() -> Finding:
    return _heartbeats("beat")


def _dead_letters() -> Finding:
    from tasks.jobs.upkeep import liveness
    from tasks.platform import deadletters

    client = liveness.quick_client()
    held = {queue: client.llen(deadletters.key(queue)) for queue in deadletters.queues(client)}
    held = {queue: n for queue, n in held.items() if n}
    if not held:
        return None, "none"
    listed = ", ".join(f"{queue}: {n}" for queue, n in sorted(held.items()))
    return f"dead letters kept ({listed}): see `keel deadletters list`", listed


def _overdue() -> Finding:
    from sqlalchemy import text

    from tasks.platform.db import transaction

    with transaction() as session:
        count = session.execute(
            text(
                "SELECT count(*) FROM jobs WHERE state = 'delayed' "
                "AND run_at < (SELECT clock_timestamp()) - make_interval(secs => :s)"
            ),
            {"s": OVERDUE_S},
        ).scalar_one()
    if count:
        return (
            f"{count} delayed jobs overdue by more than {OVERDUE_S:.0f} s "
            "(parked: no worker promotes them, or the broker refuses them)",
            str(count),
        )
    return None, "none"


def _servers() -> dict[str, tuple[Callable[[], Finding], bool]]:
    """Postgres (required to accept work), Redis and RabbitMQ if it is the broker (reported)."""
    found: dict[str, tuple[Callable[[], Finding], bool]] = {
        "postgres": (_postgres, True),
        "redis": (_redis, False),
    }
    if get_settings().broker_on_amqp:
        found["rabbitmq"] = (_rabbitmq, False)
    return found


def readiness_checks() -> dict[str, tuple[Callable[[], Finding], bool]]:
    return _servers()


def system_checks() -> dict[str, tuple[Callable[[], Finding], bool]]:
    """Everything the whole system needs; each check here is required."""
    found = {name: (check, True) for name, (check, _) in _servers().items()}
    found.update(
        workers=(_workers, True),
        beat=(_beat, True),
        dead_letters=(_dead_letters, True),
        overdue_delayed=(_overdue, True),
    )
    return found


def _submit(name: str, check: Callable[[], Finding]) -> Future:
    with _guard:
        running = _running.get(name)
        if running is None or running.done():
            running = _running[name] = _pool.submit(check)
        return running


def run(
    checks: dict[str, tuple[Callable[[], Finding], bool]], deadline_s: float = DEADLINE_S
) -> list[Check]:
    """Every check, each answered or given up on within ``deadline_s`` of the call."""
    futures = {name: (_submit(name, check), required) for name, (check, required) in checks.items()}
    until = time.monotonic() + deadline_s
    results = []
    for name, (future, required) in futures.items():
        try:
            problem, found = future.result(timeout=max(0.0, until - time.monotonic()))
        except FutureTimeout:
            problem, found = f"no answer within {deadline_s:g} s", "no answer"
        except Exception as exc:
            log.warning("health check %s failed: %s", name, exc)
            problem, found = f"unavailable ({type(exc).__name__})", "unavailable"
        results.append(Check(name, problem, found, required))
    return results


def readiness(deadline_s: float = DEADLINE_S) -> list[Check]:
    return run(readiness_checks(), deadline_s)


def system(deadline_s: float = 3.0) -> list[Check]:
    return run(system_checks(), deadline_s)
