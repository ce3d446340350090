"""Which web server serves the system-wide series of ``/metrics`` when each is scraped alone.

Every series Keel exports is system-wide: read from Postgres (jobs by state, the oldest
waiting job) or from Redis hashes every process adds to (job events, run times, API
requests). Served by each of three replicas that Prometheus scrapes one by one (a
Kubernetes ``ServiceMonitor``), each value would come three times, and a ``sum`` over the
targets would triple it. With ``KEEL_METRICS_SCRAPE=each`` one server at a time serves
them: the one holding a lease in Redis, taken by the first scrape that finds it free and
renewed by its holder's scrapes (``LEASE_S``: longer than any scrape interval, so a holder
that stops being scraped hands over within it). The others answer with their own series
only, ``keel_metrics_system_wide 0`` among them.

A server is a host and its gunicorn master: the master's workers share one identity, so
whichever of them a scrape reaches answers alike. With ``one`` (the default: a single
server, or one target in front of several) every process serves every series, as before.

Redis unreachable: the lease cannot be read, and every server serves what it can read
(Postgres's series; Redis's fail and say so in ``keel_metrics_source_up``). A sum over
targets then counts the Postgres series once per server until Redis is back; the missing
lease is itself the alert's news (``KeelMetricsSourceFailing``).
"""

from __future__ import annotations

import os
import socket

from tasks.jobs.upkeep import liveness
from tasks.platform.broker import UNREACHABLE_ERRORS
from tasks.platform.config import get_settings

KEY = "keel:metrics:system-wide"
LEASE_S = 60.0
# Taken when free, renewed by its holder; 1 if the caller holds it now.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""

_server: dict[str, str] = {}


def set_server(master_pid: int) -> None:
    """Called in each gunicorn worker (``web.gunicorn_conf.post_fork``): its master's pid."""
    _server["id"] = f"{socket.gethostname()}/{master_pid}"


def server_id() -> str:
    """This server: its host and gunicorn master, or this process outside gunicorn."""
    return _server.get("id") or f"{socket.gethostname()}/{os.getpid()}"


def serves_system_wide() -> bool:
    """Whether this scrape serves the system-wide series (see the module)."""
    if get_settings().metrics_scrape == "one":
        return True
    try:
        held = liveness.quick_client().eval(_HOLD, 1, KEY, server_id(), int(LEASE_S * 1000))
    except UNREACHABLE_ERRORS:
        return True
    return bool(held)
