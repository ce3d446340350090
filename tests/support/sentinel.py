"""Redis with Sentinel on loopback (``tests/integration/test_redis_sentinel.py``).

Debian's ``redis-server`` and ``redis-sentinel``: one primary, one replica of it and three
sentinels that fail over once two of them have not heard from the primary for a second.
The servers take a password (``requirepass``, and ``masterauth`` for replication); the
sentinels take none. Nothing is persisted: a replica's copy is all there is.

``python -m tests.support.sentinel produce QUEUE COUNT RATE OUT`` is the test's producer:
a process of its own (its ``KEEL_REDIS_URL`` the sentinel URL) that adds ``COUNT`` jobs of
``test.sleep`` at ``RATE`` a second and writes their ids to ``OUT`` as JSON when done.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from keel.embedded import free_port
from tests.support.stack import wait_for

MASTER = "keel"


def program(name: str) -> str | None:
    """Debian puts both in /usr/bin; a user's PATH may still lack it."""
    return shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin")


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen


@dataclass
class SentinelGroup:
    """A primary, a replica and three sentinels watching them, each on a free port."""

    home: Path
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    down_after_ms: int = 1000
    failover_timeout_ms: int = 3000
    servers: dict[str, Server] = field(default_factory=dict)
    sentinels: list[Server] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``KEEL_REDIS_URL`` for it: the three sentinels, the password and the primary's name."""
        first, *rest = (s.port for s in self.sentinels)
        others = "".join(f";sentinel://127.0.0.1:{port}" for port in rest)
        return f"sentinel://:{self.password}@127.0.0.1:{first}{others}/0?master_name={MASTER}"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = (self.home / f"{name}.out").open("ab")
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.home
        )

    def _redis(self, name: str, replica_of: int | None = None) -> Server:
        server_program = program("redis-server")
        if server_program is None:
            raise AssertionError("redis-server is not installed (Debian: apt-get install redis)")
        port = free_port()
        argv = [
            server_program,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.home),
            "--dbfilename", f"{name}.rdb",
            "--requirepass", self.password,
            "--masterauth", self.password,
            "--logfile", str(self.home / f"{name}.log"),
        ]  # fmt: skip
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        server = Server(name, port, self._spawn(name, argv))
        wait_for(lambda: self._answers(server), timeout=20, interval=0.05)
        return server

    def _answers(self, server: Server, port: int | None = None) -> bool:
        if server.process.poll() is not None:
            log = self.home / f"{server.name}.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise AssertionError(f"{server.name} exited:\n{tail}")
        try:
            password = None if server.name.startswith("sentinel") else self.password
            redis.Redis(port=server.port, password=password, socket_timeout=1).ping()
            return True
        except redis.RedisError:
            return False

    def _sentinel(self, index: int, primary_port: int) -> Server:
        sentinel_program = program("redis-sentinel")
        if sentinel_program is None:
            raise AssertionError(
                "redis-sentinel is not installed (Debian: apt-get install redis-sentinel)"
            )
        name, port = f"sentinel{index}", free_port()
        config = self.home / f"{name}.conf"  # sentinel rewrites it: its own file
        config.write_text(
            "\n".join(
                [
                    f"port {port}",
                    "bind 127.0.0.1",
                    f"dir {self.home}",
                    f"logfile {self.home / f'{name}.log'}",
                    f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2",
                    f"sentinel auth-pass {MASTER} {self.password}",
                    f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}",
                    f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}",
                    f"sentinel parallel-syncs {MASTER} 1",
                    "",
                ]
            )
        )
        server = Server(name, port, self._spawn(name, [sentinel_program, str(config)]))
        wait_for(lambda: self._answers(server), timeout=20, interval=0.05)
        return server

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        primary = self._redis("redis-a")
        replica = self._redis("redis-b", replica_of=primary.port)
        self.servers = {primary.name: primary, replica.name: replica}
        wait_for(lambda: self._replica_linked(replica), timeout=20, interval=0.1)
        self.sentinels = [self._sentinel(i, primary.port) for i in range(3)]
        # Each sentinel has found the replica and the two other sentinels.
        wait_for(self._sentinels_agree, timeout=30, interval=0.2)

    def _replica_linked(self, replica: Server) -> bool:
        info = redis.Redis(port=replica.port, password=self.password).info("replication")
        return info.get("master_link_status") == "up"

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            client = redis.Redis(port=sentinel.port, socket_timeout=1, decode_responses=True)
            master = client.sentinel_master(MASTER)
            if (
                int(master.get("num-other-sentinels", 0)) < 2
                or int(master.get("num-slaves", 0)) < 1
            ):
                return False
        return True

    def primary(self) -> Server:
        """The server the sentinels name as primary now."""
        client = redis.Redis(port=self.sentinels[0].port, socket_timeout=1)
        _host, port = client.sentinel_get_master_addr_by_name(MASTER)
        return next(s for s in self.servers.values() if s.port == int(port))

    def primary_client(self) -> redis.Redis:
        return redis.Redis(port=self.primary().port, password=self.password, socket_timeout=2)

    def cut_replica(self) -> Server:
        """Cut the replica off its primary and keep it off: it is given a wrong password
        for the primary, then its link is closed. Every write the primary takes from now on
        is one the replica will never have, as when a primary dies with writes it had not
        yet sent (what asynchronous replication may lose), but certain and counted. The
        replica stays eligible for promotion while its link is down for less than ten
        times ``down_after_ms`` (Sentinel's rule)."""
        primary = self.primary()
        replica = next(s for s in self.servers.values() if s is not primary)
        client = redis.Redis(port=replica.port, password=self.password, socket_timeout=2)
        client.config_set("masterauth", "not-" + self.password)
        client.client_kill_filter(_type="master")
        wait_for(lambda: not self._replica_linked(replica), timeout=10, interval=0.02)
        return replica

    def mend_replica(self, replica: Server) -> None:
        """Give ``replica`` the password again (``cut_replica``), for whatever it replicates
        from next."""
        client = redis.Redis(port=replica.port, password=self.password, socket_timeout=2)
        client.config_set("masterauth", self.password)

    def kill_primary(self) -> Server:
        """SIGKILL the primary: no shutdown, no last write to the replica."""
        primary = self.primary()
        os.killpg(primary.process.pid, signal.SIGKILL)
        primary.process.wait()
        return primary

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers.values()]:
            if server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait()

    def log_tail(self, lines: int = 30) -> str:
        found = []
        for log in sorted(self.home.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            found.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(found)


def produce(queue: str, count: int, rate: float, out: Path) -> None:
    """Add ``count`` jobs of ``test.sleep`` (50 ms) on ``queue``, ``rate`` a second."""
    import tests.support.jobs  # noqa: F401  the suite's job types
    from tasks.jobs import add

    ids = []
    started = time.monotonic()
    for n in range(count):
        wait = started + n / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        ids.append(add("test.sleep", {"ms": 50}, queue=queue).job_id)
    out.write_text(json.dumps(ids))


if __name__ == "__main__":
    if sys.argv[1] != "produce":
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
    produce(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]))
