"""Keel spread over separate hosts (network namespaces), as a deployment would run it.

| host | runs | reached at |
| --- | --- | --- |
| ``db`` | Postgres, Redis, the provider sandbox | lan :5432, bus :6379, lan :8025 |
| ``api`` | ``gunicorn -c python:web.gunicorn_conf ... 'web:create_app()'`` | lan :8000 |
| ``w1``, ``w2`` | ``celery -A tasks worker -n w1@%h`` / ``-n w2@%h`` | — |
| ``beat`` | ``celery -A tasks beat -S tasks.jobs.schedule.beat:KeelScheduler`` | — |
| ``client`` | the test's own clients (HTTP, SQL) and ``keel`` commands | — |

Only the documented commands and ``KEEL_*`` variables are used: TCP URLs
with passwords, a ``KEEL_HOME`` (and ``TMPDIR``) of its own per host, so no
host shares a file with another; migrations run once, with ``keel db
upgrade`` from the api host.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import kept_logs
from tests.support.hostprocs import HostProcess, PostgresServer, RedisServer, wait_until
from tests.support.netns import Inside, Network

PROJECT_ROOT = Path(__file__).resolve().parents[2]
KEEL = str(Path(sys.executable).with_name("keel"))  # the console script of this environment
WEB_PORT = 8000
SANDBOX_PORT = 8025
WORKERS = ("w1", "w2")
# The documented commands (README, "Run on several hosts"), run with ``python -m``.
GUNICORN = "gunicorn -c python:web.gunicorn_conf -b {bind} web:create_app()"
WORKER = "celery -A tasks worker -n {name}@%h -l INFO --without-mingle --without-gossip"
BEAT = "celery -A tasks beat -l INFO -S tasks.jobs.schedule.beat:KeelScheduler --pidfile="


def python_m(command: str) -> list[str]:
    """``command`` (a module's console script and its arguments) as ``python -m``."""
    return [sys.executable, "-m", *command.split()]


def base_env() -> dict[str, str]:
    """This process's environment without its ``KEEL_*`` (the suite's own stack)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["PYTHONPATH"] = str(PROJECT_ROOT)  # test-only job modules (-I) load from the tree
    return env


@dataclass
class KeelHosts:
    """The hosts, their servers and Keel processes; ``start`` builds all, ``stop`` removes all."""

    settings: dict[str, str] = field(default_factory=dict)  # extra KEEL_* for every host
    worker_args: Sequence[str] = ("-c", "3")
    workers: Sequence[str] = WORKERS
    start_workers: bool = True  # False: hosts only; start them with ``spawn_worker``
    with_api: bool = True
    with_beat: bool = True
    root: Path | None = None  # default: a fresh temporary folder named after the run
    processes: dict[str, HostProcess] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [
            "db",
            *(["api"] if self.with_api else []),
            *self.workers,
            *(["beat"] if self.with_beat else []),
            "client",
        ]
        self.network = Network(names)
        # Named after the run, so that the run that sweeps its namespaces removes it too.
        self.root = self.root or Path(tempfile.mkdtemp(prefix=f"{self.network.run_id}-"))
        self.client: Inside | None = None
        self.postgres: PostgresServer | None = None
        self.redis: RedisServer | None = None
        for name in ("postgres", "keel", "redis", "secret", "sandbox"):
            self.secrets[name] = secrets.token_urlsafe(32)

    # --- building -----------------------------------------------------------------------
    def start(self) -> KeelHosts:
        """Network, servers, migrations, then the Keel processes (all started before waiting)."""
        for name in self.network.names:
            self.home(name).mkdir(mode=0o700)
            (self.home(name) / "tmp").mkdir(mode=0o700)
        self.network.build()
        self.client = Inside(self.network["client"], threads=8)
        self._start_servers()
        self.keel("api" if self.with_api else "client", "db", "upgrade")
        workers = [self.spawn_worker(name) for name in self.workers if self.start_workers]
        if self.with_api:
            bind = f"{self.address('api')}:{WEB_PORT}"
            self.spawn("api", "api", python_m(GUNICORN.format(bind=bind)))
        if self.with_beat:
            self.spawn("beat", "beat", python_m(BEAT)).wait_for_log("beat: Starting")
        for worker in workers:
            worker.wait_for_log(" ready.")
        if self.with_api:
            self.wait_http("api", f"{self.web_url}/readyz")
        return self

    def _start_servers(self) -> None:
        db, env = self.network["db"], self.env("db")
        self.postgres = PostgresServer(db, self.home("db"), self.secrets["postgres"], env)
        self.postgres.start()
        self.redis = RedisServer(db, self.home("db"), self.secrets["redis"], env)
        self.redis.start()
        home = self.home("db") / "sandbox"
        sandbox = f"provider-sandbox --host {self.address('db')} --port {SANDBOX_PORT}"
        self.spawn("db", "sandbox", [KEEL, *sandbox.split(), "--home", str(home)])
        self.client(self._create_database)
        self.wait_http("sandbox", f"{self.provider_url}/health")

    def wait_http(self, label: str, url: str, timeout: float = 90) -> None:
        """Until ``GET url`` answers 200 from the client host (its process must stay up)."""
        import requests

        def answered() -> bool:
            self.processes[label].expect_running()
            try:
                return self.client(requests.get, url, timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(answered, timeout, f"GET {url} = 200")

    def _create_database(self) -> None:
        """Keel's own role and database: it needs no superuser."""
        import psycopg

        with psycopg.connect(self.postgres.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE ROLE keel LOGIN PASSWORD '{self.secrets['keel']}'")
            conn.execute("CREATE DATABASE keel OWNER keel")

    # --- configuration ------------------------------------------------------------------
    def home(self, name: str) -> Path:
        return self.root / name

    def address(self, name: str, net: str = "lan") -> str:
        return self.network[name].address(net)

    @property
    def database_url(self) -> str:
        return self.postgres.url("keel", self.secrets["keel"], "keel")

    @property
    def provider_url(self) -> str:
        return f"http://{self.address('db')}:{SANDBOX_PORT}"

    @property
    def web_url(self) -> str:
        return f"http://{self.address('api')}:{WEB_PORT}"

    def env(self, name: str) -> dict[str, str]:
        """What a process on host ``name`` is told: URLs, secrets, its own home."""
        env = {
            **base_env(),
            "KEEL_HOME": str(self.home(name)),
            "TMPDIR": str(self.home(name) / "tmp"),
        }
        if self.postgres is None or self.redis is None:
            return env
        return {
            **env,
            "KEEL_DATABASE_URL": self.database_url,
            "KEEL_REDIS_URL": self.redis.url,
            "KEEL_SECRET_KEY": self.secrets["secret"],
            "KEEL_PROVIDER_URL": self.provider_url,
            "KEEL_SANDBOX_ADMIN_KEY": self.secrets["sandbox"],
            **self.settings,
        }

    # --- processes ----------------------------------------------------------------------
    def spawn(self, name: str, label: str, argv: list[str]) -> HostProcess:
        """Start ``argv`` on host ``name`` with that host's settings; stopped by ``stop``."""
        process = HostProcess(self.network[name], label, argv, self.env(name), self.home(name))
        self.processes[label] = process.start()
        return process

    def spawn_worker(self, name: str, extra: Sequence[str] = ()) -> HostProcess:
        """``celery -A tasks worker`` on host ``name``, node name ``name@%h``."""
        worker = python_m(WORKER.format(name=name))
        return self.spawn(name, name, [*worker, *self.worker_args, *extra])

    def keel(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``keel ARGS`` on host ``name``; a failure shows its output."""
        done = subprocess.run(
            self.network[name].command([KEEL, *args]),
            env=self.env(name),
            cwd=self.home(name),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"keel {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def python(self, name: str, code: str, *args: str, timeout: float = 120) -> str:
        """``python -c CODE ARGS`` on host ``name`` with its Keel settings; its stdout."""
        done = subprocess.run(
            self.network[name].command([sys.executable, "-c", code, *args]),
            env=self.env(name),
            cwd=self.home(name),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"python on {name}: {done.stdout}{done.stderr}"
        return done.stdout

    # --- the test's clients (they run on the client host) -------------------------------
    def get(self, path: str, token: str | None = None, timeout: float = 5) -> Any:
        return self.request("GET", path, token=token, timeout=timeout)

    def request(
        self, method: str, path: str, token: str | None = None, json: Any = None, timeout: float = 5
    ) -> Any:
        import requests

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return self.client(
            requests.request,
            method,
            self.web_url + path,
            json=json,
            headers=headers,
            timeout=timeout,
        )

    def sql(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of ``query`` on Keel's database, read from the client host."""
        return self.client(_rows, self.database_url, query, params or {})

    # --- teardown -----------------------------------------------------------------------
    def stop(self) -> None:
        """Every process, then the servers, the hosts and the files: whatever failed before."""
        try:
            with ThreadPoolExecutor(max(1, len(self.processes))) as pool:  # side by side
                list(pool.map(lambda process: process.stop(timeout=20), self.processes.values()))
            for server in (self.redis, self.postgres):
                if server is not None:
                    server.stop()
        finally:
            if self.client is not None:
                self.client.close()
            self.network.destroy()
            kept_logs.keep(self.root, self.root.name)  # if KEEL_TEST_LOG_DIR is set
            shutil.rmtree(self.root, ignore_errors=True)


def _rows(url: str, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(
        url, connect_timeout=10, options="-c statement_timeout=30000", row_factory=dict_row
    ) as conn:
        return conn.execute(query, params).fetchall()
