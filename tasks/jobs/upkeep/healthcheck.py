"""``python -m tasks.jobs.upkeep.healthcheck worker|beat [NAME]``: a container health check.

It answers for the processes of its own host, from their local heartbeat
files (``tasks.jobs.upkeep.liveness``): exit 0 when one of that kind ran its loop
within ``liveness.FRESH_S`` (or, while its consumer reconnects to the broker,
within the grace), Redis took one of its heartbeats within the grace
(``KEEL_HEALTH_REDIS_GRACE_S``, 60 s), and, for a worker, its consumer is not
wedged; 1 otherwise. So a Redis outage shorter than the grace does not get a
healthy worker restarted (its running jobs would be lost for nothing), while
a worker whose loop stopped, or one cut from Redis for longer, is reported.

A worker's consumer is wedged when it has consumed nothing, although it
should, for ``liveness.WEDGED_S`` (60 s): every prefetch slot held by
messages no task of the worker has, or a slot free and messages waiting in
its queues with none received (``tasks.jobs.run.slots.ConsumerWatch``). It says
``consumer wedged: <which> for N s`` (exit 1) within two heartbeats (4 s) of
those 60 s: a heartbeat sees the slots, or the messages waiting, and the next
one that none was received. 60 s is longer than the worker's own repair of
orphaned slots takes (``KEEL_PREFETCH_ORPHAN_S``, 30 s, at most 45 s, checked
every 5 s), so a worker that mends itself is not reported. A busy worker (every slot carried
by a running or reserved task) and an idle one (nothing waiting) are
healthy. On RabbitMQ the server counts prefetch, and only the loop and Redis
are judged.

``NAME`` limits the answer to one process of several on the host: its node
name (``name@host``) or the part before ``@``.

Where no local file of a live process can be read (another ``KEEL_HOME``), it
falls back to the heartbeats in Redis.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

import redis

from tasks.jobs.upkeep import liveness
from tasks.platform.config import get_settings


def _running(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[call-overload]
    except (OSError, ValueError, TypeError):
        return False
    return True


def _named(member: str, name: str | None) -> bool:
    return name is None or member == name or member.partition("@")[0] == name


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
    elif entry["age_s"] > liveness.FRESH_S:
        return f"no heartbeat for {entry['age_s']:.0f} s: its loop is stuck"
    if entry.get("reconnecting"):
        return None  # no consumer to judge until it is back
    return liveness.wedged(entry.get("consumer"), entry["age_s"])


def _from_files(role: str, name: str | None = None) -> tuple[int, str] | None:
    grace = get_settings().health_redis_grace_s
    beats = [
        b
        for b in liveness.local_beats(role)
        if _running(b.get("pid")) and _named(b["member"], name)
    ]
    if not beats:
        return None
    now = time.time()
    judged = [(entry["member"], _judge(entry, grace, now)) for entry in beats]
    healthy = [member for member, problem in judged if problem is None]
    notes = [member if problem is None else f"{member}: {problem}" for member, problem in judged]
    word = "alive" if healthy else "unhealthy"
    return (0 if healthy else 1), f"{role}: {word} ({'; '.join(notes)})"


def _from_redis(role: str, name: str | None = None) -> tuple[int, str]:
    host = socket.gethostname()
    try:
        client = liveness.quick_client()
        members = liveness.fresh(client, role)
        mine = [m for m in members if (m == host or m.endswith(f"@{host}")) and _named(m, name)]
        stuck = liveness.stuck(client, role, mine)
    except redis.RedisError as exc:
        return 1, f"{role}: no local heartbeat and redis unavailable: {exc}"
    if not mine:
        return 1, f"{role}: no recent heartbeat ({name or host})"
    judged = [(m, liveness.wedged(stuck.get(m))) for m in mine]
    healthy = [member for member, problem in judged if problem is None]
    notes = [member if problem is None else f"{member}: {problem}" for member, problem in judged]
    return (0 if healthy else 1), (
        f"{role}: {'alive' if healthy else 'unhealthy'} ({'; '.join(notes)})"
    )


def main(argv: list[str]) -> int:
    """Exit 0 if a ``worker``/``beat`` of this host (named ``NAME``) is healthy."""
    role = argv[0] if argv else "worker"
    name = argv[1] if len(argv) > 1 else None
    code, said = _from_files(role, name) or _from_redis(role, name)
    print(said)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
