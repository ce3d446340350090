"""``keel up``: the whole stack under one supervisor.

Starts embedded Postgres and Redis when no URLs are configured, migrates,
writes ``$KEEL_HOME/env`` and runs the web app, a worker, beat, Flower and
the provider sandbox as children in their own sessions. A signal to the
supervisor is forwarded to every child (web first, workers last, so jobs in
flight finish); if any child dies, the rest are stopped too.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tasks.config import ENV_FILE_NAME, keel_home, reload_settings, write_env_file
from tasks.embedded import EmbeddedPostgres, EmbeddedRedis

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STOP_TIMEOUT_S = 60


def alembic_config():
    from alembic.config import Config

    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["configure_logger"] = False
    return config


def migrate() -> None:
    """Alembic upgrade head against the configured database."""
    from alembic import command

    command.upgrade(alembic_config(), "head")


def secret_key(home: Path) -> str:
    if os.environ.get("KEEL_SECRET_KEY"):
        return os.environ["KEEL_SECRET_KEY"]
    path = home / "secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()


@dataclass
class Child:
    name: str
    args: list[str]
    process: subprocess.Popen | None = None


@dataclass
class Stack:
    """The supervisor behind ``keel up``."""

    home: Path = field(default_factory=keel_home)
    children: list[Child] = field(default_factory=list)
    embedded: list[EmbeddedPostgres | EmbeddedRedis] = field(default_factory=list)
    stopping: bool = False

    def environment(self) -> dict[str, str]:
        env = {
            "KEEL_HOME": str(self.home),
            "KEEL_WEB_PORT": os.environ.get("KEEL_WEB_PORT", "8000"),
            "KEEL_FLOWER_PORT": os.environ.get("KEEL_FLOWER_PORT", "5555"),
            "KEEL_SANDBOX_PORT": os.environ.get("KEEL_SANDBOX_PORT", "8025"),
            "KEEL_FAULT_INJECTION": os.environ.get("KEEL_FAULT_INJECTION", "0"),
            "KEEL_SECRET_KEY": secret_key(self.home),
            "KEEL_FLOWER_USER": os.environ.get("KEEL_FLOWER_USER", "keel"),
        }
        env["KEEL_FLOWER_PASSWORD"] = os.environ.get(
            "KEEL_FLOWER_PASSWORD",
            hashlib.sha256(f"flower:{env['KEEL_SECRET_KEY']}".encode()).hexdigest()[:24],
        )
        env["KEEL_PROVIDER_URL"] = os.environ.get(
            "KEEL_PROVIDER_URL", f"http://127.0.0.1:{env['KEEL_SANDBOX_PORT']}"
        )
        env["KEEL_WEB_URL"] = f"http://127.0.0.1:{env['KEEL_WEB_PORT']}"
        database_url = os.environ.get("KEEL_DATABASE_URL")
        if not database_url:
            postgres = EmbeddedPostgres(self.home)
            database_url = postgres.start()
            self.embedded.append(postgres)
        redis_url = os.environ.get("KEEL_REDIS_URL")
        if not redis_url:
            redis_server = EmbeddedRedis(self.home)
            redis_url = redis_server.start()
            self.embedded.append(redis_server)
        env["KEEL_DATABASE_URL"] = database_url
        env["KEEL_REDIS_URL"] = redis_url
        return env

    def plan(self, env: dict[str, str]) -> list[Child]:
        celery = [sys.executable, "-m", "celery", "-A", "tasks"]
        flower_auth = f"{env['KEEL_FLOWER_USER']}:{env['KEEL_FLOWER_PASSWORD']}"
        web_bind = f"127.0.0.1:{env['KEEL_WEB_PORT']}"
        return [
            Child("worker", [*celery, "worker", "-l", "INFO", "-n", "worker@%h", "-E"]),
            Child("beat", [*celery, "beat", "-l", "INFO", "-S", "tasks.jobs.beat:KeelScheduler",
                           "--pidfile="]),
            Child("sandbox", [sys.executable, "-m", "tasks.notifications.sandbox",
                              "--port", env["KEEL_SANDBOX_PORT"]]),
            Child("flower", [*celery, "flower", f"--port={env['KEEL_FLOWER_PORT']}",
                             "--address=127.0.0.1", f"--basic-auth={flower_auth}"]),
            Child("web", [sys.executable, "-m", "gunicorn", "-c", "python:web.gunicorn_conf",
                          "-b", web_bind, "web:create_app()"]),
        ]  # fmt: skip

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            env = self.environment()
            os.environ.update(env)
            reload_settings()
            migrate()
            write_env_file(self.home / ENV_FILE_NAME, env)
            (self.home / ENV_FILE_NAME).chmod(0o600)
            child_env = {**os.environ, **env}
            for child in self.plan(env):
                child.process = subprocess.Popen(
                    child.args, env=child_env, cwd=PROJECT_ROOT, start_new_session=True
                )
                self.children.append(child)
            self._announce(env)
            return self._watch()
        finally:
            self._stop_all()

    def _announce(self, env: dict[str, str]) -> None:
        print(
            f"\nKeel is up.\n"
            f"  web     {env['KEEL_WEB_URL']}/api/v1   (OpenAPI: /api/v1/openapi.json)\n"
            f"  flower  http://127.0.0.1:{env['KEEL_FLOWER_PORT']}"
            f"  (user {env['KEEL_FLOWER_USER']}, password in {self.home / ENV_FILE_NAME})\n"
            f"  sandbox {env['KEEL_PROVIDER_URL']}\n"
            f"  env     {self.home / ENV_FILE_NAME}\n"
            f"  token   keel token --tenant acme --user alice --role operator\n"
            f"Ctrl+C stops everything.\n",
            flush=True,
        )

    def _watch(self) -> int:
        while not self.stopping:
            for child in self.children:
                code = child.process.poll() if child.process else None
                if code is not None:
                    print(f"keel: {child.name} exited with {code}; stopping", file=sys.stderr)
                    return 1
            time.sleep(0.5)
        return 0

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        for child in reversed(self.children):  # web first, worker last
            if child.process and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()
        for server in reversed(self.embedded):
            server.stop()
