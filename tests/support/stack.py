"""Real servers and worker processes for the tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.embedded import EmbeddedPostgres, EmbeddedRedis
from tasks.platform import db
from tasks.platform.config import reload_settings
from tasks.platform.migrate import migrate
from tests.support.databases import make_template

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")


# The suite's throwaway cluster does not flush to disk: ``fsync`` guards against the
# machine crashing, which no test does. A killed, stopped or frozen Postgres process loses
# nothing it committed either way (the WAL is written to the OS at every commit), so every
# crash and outage test means what it says.
TEST_POSTGRES_SETTINGS = {"fsync": "off", "full_page_writes": "off"}


@dataclass
class TestStack:
    home: Path
    redis_port: int
    external_db: bool = False
    external_redis: bool = False
    servers: list = field(default_factory=list)

    def start(self) -> None:
        if not self.external_db:
            postgres = EmbeddedPostgres(self.home, TEST_POSTGRES_SETTINGS)
            postgres.start()
            self.servers.append(postgres)
        if not self.external_redis:
            redis_server = EmbeddedRedis(self.home, self.redis_port, persist=False)
            redis_server.start()
            self.servers.append(redis_server)
        reload_settings()
        db.dispose()
        migrate()
        make_template()  # the fast tier's modules copy their databases from it

    def stop(self) -> None:
        db.dispose()
        for server in reversed(self.servers):
            server.stop()

    def restart_redis(self, down_s: float = 0.0) -> None:
        """Stop the embedded Redis (it keeps nothing) and start it again on the same port."""
        [redis_server] = [s for s in self.servers if isinstance(s, EmbeddedRedis)]
        redis_server.stop()
        time.sleep(down_s)
        redis_server.start()


@dataclass
class WorkerProcess:
    """A real ``celery -A tasks worker`` subprocess (or ``-A app``, in ``cwd``)."""

    home: Path
    name: str
    concurrency: int = 3
    app: str = "tasks"
    cwd: Path = PROJECT_ROOT
    include: str | None = "tests.support.jobs"  # the test suite's job types
    extra_env: dict[str, str] = field(default_factory=dict)
    queues: str | None = None
    pool: str | None = None  # Celery's -P (prefork unless given)
    process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.home / f"worker-{self.name}.log"

    def start(self, timeout: float = 60) -> None:
        env = {**os.environ, **self.extra_env}
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "worker",
            *(["-I", self.include] if self.include else []),
            "-n",
            f"{self.name}@%h",
            "-c",
            str(self.concurrency),
            "-l",
            "INFO",
            "-E",
            "--without-mingle",
            "--without-gossip",
            *(["-Q", self.queues] if self.queues else []),
            *(["-P", self.pool] if self.pool else []),
        ]
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            args,
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._ready, timeout=timeout, interval=0.2)

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"worker {self.name} exited:\n{self.log_tail()}")
        return " ready." in self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@dataclass
class BeatProcess:
    """A real ``celery -A <app> beat`` subprocess with Keel's scheduler class."""

    home: Path
    name: str
    app: str = "tasks"  # a test app may add a beat_schedule (tests.support.beat_app)
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.home / f"beat-{self.name}.log"

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "beat",
            "-l",
            "INFO",
            "-S",
            "tasks.jobs.schedule.beat:KeelScheduler",
            "--pidfile=",
            "-s",
            str(self.home / f"beat-{self.name}-schedule"),
        ]
        self.process = subprocess.Popen(
            args,
            cwd=PROJECT_ROOT,
            env={**os.environ, **self.extra_env},
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: "beat: Starting" in self.log_path.read_text(errors="replace"),
            timeout=30,
            interval=0.2,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def sandbox_admin_headers() -> dict[str, str]:
    """What the sandbox's ``/admin`` and ``/v1/ledger`` routes require (the session's key)."""
    from provider_sandbox.admin import ADMIN_KEY_HEADER

    return {ADMIN_KEY_HEADER: os.environ["KEEL_SANDBOX_ADMIN_KEY"]}


@dataclass
class SandboxProcess:
    """The provider sandbox as a real subprocess (``keel provider-sandbox``)."""

    home: Path
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        import requests

        args = [
            sys.executable,
            "-m",
            "provider_sandbox",
            "--port",
            str(self.port),
            "--home",
            str(self.home / "sandbox"),
        ]
        self.process = subprocess.Popen(
            args,
            cwd=PROJECT_ROOT,
            stdout=(self.home / "sandbox.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def up() -> bool:
            try:
                return requests.get(f"{self.url}/health", timeout=1).ok
            except requests.RequestException:
                return False

        wait_for(up, timeout=30, interval=0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


@dataclass
class WebProcess:
    """The API served by a real gunicorn, configured exactly as ``keel up`` serves it."""

    home: Path
    port: int = 0
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / f"web-{self.port}.log"

    def start(self) -> None:
        import requests

        from keel.embedded import free_port

        self.port = self.port or free_port()
        args = [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "python:web.gunicorn_conf",
            "-b",
            f"127.0.0.1:{self.port}",
            *self.extra_args,
            "web:create_app()",
        ]
        self.process = subprocess.Popen(
            args,
            cwd=PROJECT_ROOT,
            env={**os.environ, **self.extra_env},
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def up() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"gunicorn exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                return requests.get(f"{self.url}/healthz", timeout=1).ok
            except requests.RequestException:
                return False

        wait_for(up, timeout=60, interval=0.2)

    def worker_pids(self) -> set[int]:
        """The pids of gunicorn's worker processes (the arbiter's children)."""
        import psutil

        return {child.pid for child in psutil.Process(self.process.pid).children()}

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextmanager
def worker_pair(home: Path, prefix: str, queue: str) -> Iterator[list[WorkerProcess]]:
    """Two worker processes of concurrency 4 each on ``queue`` (the acceptance tests' setup),
    stopped afterwards."""
    started = [WorkerProcess(home, f"{prefix}{n}", concurrency=4, queues=queue) for n in (1, 2)]
    for worker in started:
        worker.start()
    try:
        yield started
    finally:
        for worker in started:
            worker.stop()


def republished(workers: list[WorkerProcess], queue: str) -> int:
    """Jobs of ``queue`` the reconciler published again (their message was lost), as the
    ``workers``' logs say."""
    pattern = rf"republished (\d+) waiting jobs of queue {re.escape(queue)}\b"
    return sum(
        int(found)
        for worker in workers
        for found in re.findall(pattern, worker.log_path.read_text(errors="replace"))
    )
