"""Debian's PgBouncer in front of the suite's Postgres (``tests/integration/test_pgbouncer.py``).

Transaction pooling, and no ``ignore_startup_parameters``: a client that sends libpq's
startup ``options`` is refused, as a production PgBouncer refuses it. Clients are trusted
(the listener is on loopback); PgBouncer logs in to Postgres as the suite's URL says.
Postgres refuses to run as root, and PgBouncer does too: as root it runs the way the
embedded Postgres does (``keel.embedded.postgres_server.server_launch``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from keel.embedded import free_port
from keel.embedded.postgres_server import server_launch
from tests.support.stack import wait_for


def pgbouncer_program() -> str | None:
    """Debian installs it in /usr/sbin, which a user's PATH may lack."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")


@dataclass
class PgBouncer:
    """One ``pgbouncer`` process on a free loopback port, pooling ``database_url``'s database."""

    home: Path
    database_url: str
    pool_mode: str = "transaction"
    port: int = 0
    process: subprocess.Popen | None = None
    # More [pgbouncer] settings (the TLS test's client_tls_*)
    settings: list[str] = field(default_factory=list)
    # Set: the wait for it to answer connects with these libpq parameters (its TLS ones)
    probe_params: str = ""

    @property
    def log_path(self) -> Path:
        return self.home / "pgbouncer.log"

    @property
    def url(self) -> str:
        """Clients' URL: the same user and database, through PgBouncer."""
        target = make_url(self.database_url)
        return f"postgresql://{target.username}@127.0.0.1:{self.port}/{target.database}"

    def _write_config(self) -> Path:
        target = make_url(self.database_url)
        host = target.query.get("host") or target.host or "localhost"
        server = [
            f"host={host}",
            f"port={target.port or 5432}",
            f"dbname={target.database}",
            f"user={target.username}",
        ]
        if target.password:
            server.append(f"password={target.password}")
        (self.home / "users.txt").write_text(f'"{target.username}" ""\n')
        config = self.home / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"{target.database} = {' '.join(server)}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.home / 'users.txt'}",
                    f"pool_mode = {self.pool_mode}",
                    "max_client_conn = 1000",
                    "default_pool_size = 20",
                    f"logfile = {self.log_path}",
                    *self.settings,
                    "",
                ]
            )
        )
        return config

    def start(self) -> None:
        program = pgbouncer_program()
        if program is None:
            raise AssertionError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config = self._write_config()
        launch = server_launch()
        self.process = subprocess.Popen(
            launch.argv(Path(program), str(config)),
            stdout=self.log_path.with_suffix(".out").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **launch.popen_kwargs(),
        )
        wait_for(self._answers, timeout=30, interval=0.1)

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"pgbouncer exited:\n{self.log_tail()}")
        try:
            url = f"{self.url}?{self.probe_params}" if self.probe_params else self.url
            with psycopg.connect(url, connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def log_tail(self, lines: int = 40) -> str:
        found = [
            path.read_text(errors="replace")
            for path in (self.log_path, self.log_path.with_suffix(".out"))
            if path.exists()
        ]
        return "\n".join("\n".join(found).splitlines()[-lines:])

    def stop(self) -> None:
        """Immediate shutdown (SIGTERM): clients' connections are closed, their transactions
        rolled back by Postgres."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
