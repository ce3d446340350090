"""``python -m tasks.jobs.upkeep.healthcheck worker|beat``: a container health check.

It answers for the processes of its own host, from their local heartbeat
files (``tasks.jobs.upkeep.liveness``): exit 0 when one of that kind ran its loop
within ``liveness.FRESH_S`` (or, while its consumer reconnects to the broker,
within the grace) and Redis took one of its heartbeats within the grace
(``KEEL_HEALTH_REDIS_GRACE_S``, 60 s); 1 otherwise. So a Redis outage shorter
than the grace does not get a healthy worker restarted (its running jobs
would be lost for nothing), while a worker whose loop stopped, or one cut
from Redis for longer, is reported. Where no local file of a live process
can be read (another ``KEEL_HOME``), it falls back to the heartbeats in Redis.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

import redis

from tasks.config import get_settings
from tasks.jobs.upkeep import liveness


def _running(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[call-overload]
    except (OSError, ValueError, TypeError):
        return False
    return True


def _judge(entry: dict[str, Any], grace: float, now: float) -> str | None:
    """What is wrong with one process's local heartbeat (None: nothing)."""
    ok_at = entry.get("redis_ok_at")
    cut_s = None if ok_at is None else now - float(ok_at)
    if entry.get("reconnecting") or cut_s is None or cut_s > liveness.FRESH_S:
        if cut_s is None or cut_s > grace:
            since = "never" if cut_s is None else f"{cut_s:.0f} s ago"
            return f"cut from redis: it last answered {since} (grace {grace:g} s)"
        if entry["age_s"] > grace:
            return f"no heartbeat for {entry['age_s']:.0f} s"
        return None
    if entry["age_s"] > liveness.FRESH_S:
        return f"no heartbeat for {entry['age_s']:.0f} s: its loop is stuck"
    return None


def _from_files(role: str) -> tuple[int, str] | None:
    grace = get_settings().health_redis_grace_s
    beats = [b for b in liveness.local_beats(role) if _running(b.get("pid"))]
    if not beats:
        return None
    now = time.time()
    judged = [(entry["member"], _judge(entry, grace, now)) for entry in beats]
    healthy = [member for member, problem in judged if problem is None]
    notes = [member if problem is None else f"{member}: {problem}" for member, problem in judged]
    word = "alive" if healthy else "unhealthy"
    return (0 if healthy else 1), f"{role}: {word} ({'; '.join(notes)})"


def _from_redis(role: str) -> tuple[int, str]:
    host = socket.gethostname()
    try:
        members = liveness.fresh(liveness.quick_client(), role)
    except redis.RedisError as exc:
        return 1, f"{role}: no local heartbeat and redis unavailable: {exc}"
    mine = [m for m in members if m == host or m.endswith(f"@{host}")]
    return (0 if mine else 1), (
        f"{role}: {'alive' if mine else 'no recent heartbeat'} ({', '.join(mine) or host})"
    )


def main(argv: list[str]) -> int:
    """Exit 0 if a ``worker``/``beat`` of this host is alive (a container health check)."""
    role = argv[0] if argv else "worker"
    code, said = _from_files(role) or _from_redis(role)
    print(said)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
