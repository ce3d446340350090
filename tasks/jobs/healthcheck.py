"""``python -m tasks.jobs.healthcheck worker|beat``: a container health check.

Exits 0 when a process of that kind on this host (``worker@<host>``,
``beat@<host>``) refreshed its heartbeat within ``liveness.FRESH_S``; 1
otherwise, or when Redis does not answer within ``liveness.TIMEOUT_S``.
"""

from __future__ import annotations

import socket
import sys

import redis

from tasks.jobs import liveness


def main(argv: list[str]) -> int:
    """Exit 0 if a ``worker``/``beat`` of this host beat recently (a container health check)."""
    role = argv[0] if argv else "worker"
    host = socket.gethostname()
    try:
        members = liveness.fresh(liveness.quick_client(), role)
    except redis.RedisError as exc:
        print(f"{role}: redis unavailable: {exc}", file=sys.stderr)
        return 1
    mine = [m for m in members if m == host or m.endswith(f"@{host}")]
    print(f"{role}: {'alive' if mine else 'no recent heartbeat'} ({', '.join(mine) or host})")
    return 0 if mine else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
