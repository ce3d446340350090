"""The real processes a figure runs against: Celery workers, gunicorn, the provider sandbox.

Each is started in its own session so that stopping it (SIGTERM, then
SIGKILL of its process group on a timeout) reaches every child it forked,
and nothing the bench started outlives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from bench.env import PROJECT_ROOT, BenchEnv
from keel.embedded import free_port


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until truthy; a bench that hangs is worse than one that fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not done within {timeout:.0f}s")


@dataclass
class Child:
    """A subprocess with its output in ``home/<name>.log``."""

    env: BenchEnv
    name: str
    args: list[str]
    process: subprocess.Popen | None = None
    extra_env: dict[str, str] | None = None  # on top of the bench's environment

    @property
    def log_path(self) -> Path:
        return self.env.home / f"{self.name}.log"

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def spawn(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.args,
                cwd=PROJECT_ROOT,
                env=self.env.child_env(**(self.extra_env or {})),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}"
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (warm shutdown), then SIGKILL the process group we created."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def __enter__(self) -> Child:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError


class LogReadyChild(Child):
    """A worker that is ready once its log shows ``ready_line`` (the log starts empty)."""

    ready_line = ""

    def start(self) -> None:
        self.log_path.unlink(missing_ok=True)
        self.spawn()

        def ready() -> bool:
            self.check_alive()
            return self.ready_line in self.log_path.read_text(errors="replace")

        wait_for(ready, 90, f"worker {self.name} start", interval=0.1)


class CeleryWorker(LogReadyChild):
    """``celery -A <app> worker`` with the same flags for bare Celery and Keel."""

    ready_line = " ready."

    def __init__(
        self,
        env: BenchEnv,
        name: str,
        app: str,
        concurrency: int,
        extra: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            *(extra or []),
            "-c",
            str(concurrency),
            "-P",
            "prefork",
            "-n",
            f"{name}@%h",
            "-l",
            "INFO",
            "--without-mingle",
            "--without-gossip",
        ]
        super().__init__(env, name, args, extra_env=extra_env)


class HttpChild(Child):
    """A server that is ready once ``GET health_path`` answers 200."""

    health_path = "/"

    def __init__(self, env: BenchEnv, name: str, args: list[str], port: int) -> None:
        super().__init__(env, name, args)
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.spawn()

        def up() -> bool:
            self.check_alive()
            try:
                return requests.get(self.url + self.health_path, timeout=1).ok
            except requests.RequestException:
                return False

        wait_for(up, 60, f"{self.name} start", interval=0.2)


def gunicorn(env: BenchEnv, workers: int) -> HttpChild:
    """The API under ``-c python:web.gunicorn_conf``, as ``keel up`` serves it."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        "python:web.gunicorn_conf",
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        str(workers),
        "--graceful-timeout",
        "10",
        "--backlog",
        "2048",
        "web:create_app()",
    ]
    server = HttpChild(env, "gunicorn", args, port)
    server.health_path = "/healthz"
    return server


def sandbox(env: BenchEnv) -> HttpChild:
    """The provider sandbox on the port every Keel worker was told (``KEEL_PROVIDER_URL``)."""
    args = [
        sys.executable,
        "-m",
        "provider_sandbox",
        "--port",
        str(env.sandbox_port),
        "--home",
        str(env.home / "sandbox"),
    ]
    server = HttpChild(env, "sandbox", args, env.sandbox_port)
    server.health_path = "/health"
    return server
