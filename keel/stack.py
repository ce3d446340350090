"""``keel up``: the whole stack under one supervisor.

Takes the home's lock, starts embedded Postgres and Redis when no URLs are
configured, migrates, writes ``$KEEL_HOME/env`` and runs the web app, a
worker, beat, Flower and the provider sandbox as children
(``keel.supervisor``): each restarted if it dies, none outliving ``keel up``.
The embedded servers and Flower are extras (``[embedded]``, ``[flower]``) and the
sandbox a distribution of its own: one that is not installed is said in one line
(``keel.extras``), and the stack starts without it (the servers: refused, unless
their URLs are set).
A signal to the supervisor stops every child (web first, workers last, so
jobs in flight finish), then the servers. Everything it creates under
``$KEEL_HOME`` is private to its user from the first byte (umask 077).
"""

from __future__ import annotations

import errno
import faulthandler
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import redis

from keel import embedded, extras, stacks
from keel.embedded.private import create_private
from keel.errors import StartRefused
from keel.home import HomeBusy, HomeLock
from keel.supervisor import Child, Supervisor
from tasks.jobs.upkeep import liveness
from tasks.platform.builtins import parse_builtin
from tasks.platform.config import (
    ENV_FILE_NAME,
    ProcessSettings,
    keel_home,
    reload_settings,
    write_env_file,
)
from tasks.platform.lifeline import PRIVATE_UMASK
from tasks.platform.migrate import migrate

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STACK_HEADER = "Keel-Stack"  # web.system.STACK_HEADER: /readyz names the stack that started it
READY_PROBE_S = 1.0
READY_REPORT_S = 15.0
# What a child gets if the supervisor dies without stopping it (kill -9): a quick exit.
# Gunicorn and Celery take SIGQUIT as "stop now" (a Celery cold shutdown hands unacked
# messages back to the broker); the rest stop at once on SIGTERM.
DEATH_SIGNALS = {"worker": signal.SIGQUIT, "web": signal.SIGQUIT}


# Imports each job module named on the command line, as a child of the stack would (from
# Keel's folder, with KEEL_JOB_PATH appended); says in one line which one did not, and why.
_IMPORT_CHECK = """
import sys
from importlib import import_module

from tasks.platform.catalog import extend_import_path

extend_import_path()
for name in sys.argv[1:]:
    try:
        import_module(name)
    except BaseException as exc:
        text = str(exc).strip().splitlines()
        line = f"{name}: {type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
        missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        if missing and (name == missing or name.startswith(missing + ".")):
            line += f" ({WHERE})"
        print(line)
        sys.exit(1)
"""


_WHERE = (
    "keel up imports your modules from the folder it was started in, KEEL_JOB_PATH and PYTHONPATH"
)


def unimportable(modules: list[str], timeout_s: float = 120) -> str | None:
    """Why one of your job modules would not import in the stack's processes, or ``None``.

    Checked in a child of its own, exactly as the stack's children will import it (their
    folder, environment and ``KEEL_JOB_PATH``), before anything starts: a module that does
    not import would otherwise make every child fail and be restarted until the
    supervisor gives up, through pages of tracebacks.
    """
    if not modules:
        return None
    checked = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK.replace("{WHERE}", _WHERE), *modules],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if checked.returncode == 0:
        return None
    lines = checked.stdout.strip().splitlines() or checked.stderr.strip().splitlines() or ["?"]
    return f"job module {lines[-1]}"


def refuse_taken_ports(ports: dict[str, int]) -> None:
    """``StartRefused`` naming the first port (and its variable) another process listens on.

    Bound as the servers will bind it (127.0.0.1, ``SO_REUSEADDR`` as gunicorn and
    Tornado set it), so a port merely in TIME_WAIT after a stop does not count.
    """
    for variable, port in ports.items():
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                raise StartRefused(
                    f"port {port} is in use by another program; set {variable} to a free port "
                    f"(e.g. {variable}={_free_near(port)} keel up)"
                ) from None


def _free_near(port: int) -> int:
    for candidate in range(port + 1, min(port + 100, 65535)):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    return 0


def secret_key(home: Path, configured: str | None) -> str:
    return configured or _kept(home / "secret", 48)


def _kept(path: Path, size: int) -> str:
    """A random token generated once in ``path`` (readable by this user alone)."""
    create_private(path, secrets.token_urlsafe(size))
    return path.read_text().strip()


@dataclass
class Stack:
    """The supervisor behind ``keel up``."""

    home: Path = field(default_factory=keel_home)
    supervisor: Supervisor = field(default_factory=Supervisor)
    env: dict[str, str] = field(default_factory=dict)
    stopping: bool = False
    starting: bool = True  # a signal now interrupts the start itself
    ready: bool = False
    _next_probe: float = 0.0
    _next_report: float = 0.0
    _children_started_at: float = 0.0

    def environment(self) -> dict[str, str]:
        """The stack's settings; starts the embedded servers that no URL replaces.

        Read from the process environment alone (``ProcessSettings``): the env
        file is this function's output, and an earlier run's URLs in it are
        no configured servers.
        """
        given = ProcessSettings()
        ports = {"KEEL_WEB_PORT": given.web_port, "KEEL_FLOWER_PORT": given.flower_port}
        if "notifications" in parse_builtin(given.builtin_jobs):
            ports["KEEL_SANDBOX_PORT"] = given.sandbox_port
        refuse_taken_ports(ports)
        secret = secret_key(self.home, given.secret_key)
        env = {
            "KEEL_HOME": str(self.home),
            "KEEL_STACK_ID": secrets.token_hex(8),
            "KEEL_WEB_PORT": str(given.web_port),
            "KEEL_FLOWER_PORT": str(given.flower_port),
            "KEEL_SANDBOX_PORT": str(given.sandbox_port),
            "KEEL_FAULT_INJECTION": "1" if given.fault_injection else "0",
            "KEEL_SECRET_KEY": secret,
            # Prometheus reads /metrics with it (the API's port is no private one).
            "KEEL_METRICS_TOKEN": given.metrics_token or _kept(self.home / "metrics-token", 32),
            "KEEL_FLOWER_USER": given.flower_user,
            "KEEL_SANDBOX_ADMIN_KEY": given.sandbox_admin_key or secrets.token_urlsafe(32),
            "KEEL_FLOWER_PASSWORD": given.flower_password
            or hashlib.sha256(f"flower:{secret}".encode()).hexdigest()[:24],
            "KEEL_PROVIDER_URL": given.provider_url or f"http://127.0.0.1:{given.sandbox_port}",
            "KEEL_WEB_URL": f"http://127.0.0.1:{given.web_port}",
        }
        if given.job_modules:  # `keel up --include`: every child, and later CLI calls, load them
            env["KEEL_JOB_MODULES"] = given.job_modules
        if given.job_path:  # where they import from (`keel up`'s folder): children run in ours
            env["KEEL_JOB_PATH"] = given.job_path
        if given.celery_app:  # `keel up --app`: the worker and beat run it, web and CLI load it
            env["KEEL_CELERY_APP"] = given.celery_app
        # Written even as "none": later CLI calls and scripts see the same built-in apps.
        env["KEEL_BUILTIN_JOBS"] = given.builtin_jobs
        database_url = given.database_url
        embedded.require_unless(database_url, given.redis_url)  # the [embedded] extra
        if not database_url:
            self.supervisor.output.say(f"starting Postgres in {self.home / 'pg'}")
            postgres = embedded.EmbeddedPostgres(self.home)
            database_url = postgres.start()
            self.supervisor.add(postgres, postgres.start, running=True)
        redis_url = given.redis_url
        if not redis_url:
            # A fresh password each run: only this stack's processes learn it (env file, environ).
            redis_server = embedded.EmbeddedRedis(self.home, password=secrets.token_urlsafe(32))
            self.supervisor.output.say(f"starting Redis on port {redis_server.port}")
            redis_url = redis_server.start()
            self.supervisor.add(redis_server, redis_server.start, running=True)
        env["KEEL_DATABASE_URL"] = database_url
        env["KEEL_REDIS_URL"] = redis_url
        if given.broker_url:  # Celery's messages on RabbitMQ; nothing embedded replaces it
            env["KEEL_BROKER_URL"] = given.broker_url
        return env

    @staticmethod
    def _sandbox(env: dict[str, str]) -> list[Child]:
        """The provider sandbox stands in for the notifications app's provider: only with it,
        and where it is installed (``keel-provider-sandbox``, a distribution of its own)."""
        if "notifications" not in parse_builtin(env["KEEL_BUILTIN_JOBS"]):
            return []
        if not extras.installed(extras.SANDBOX):
            return []
        port = env["KEEL_SANDBOX_PORT"]
        return [Child("sandbox", [sys.executable, "-m", extras.SANDBOX, "--port", port])]

    @staticmethod
    def _flower(env: dict[str, str]) -> list[Child]:
        """Flower (``python -m keel.flower``: its /metrics and /healthcheck behind its
        password), where the ``[flower]`` extra is installed."""
        if extras.missing(extras.FLOWER):
            return []
        port, address = f"--port={env['KEEL_FLOWER_PORT']}", "--address=127.0.0.1"
        return [Child("flower", [sys.executable, "-m", "keel.flower", port, address])]

    @staticmethod
    def left_out(env: dict[str, str]) -> list[str]:
        """One line for each part of the stack that does not run because it is not installed."""
        lines = []
        wanted = "notifications" in parse_builtin(env["KEEL_BUILTIN_JOBS"])
        if wanted and not extras.installed(extras.SANDBOX):
            lines.append(
                f"the provider sandbox is not installed ({extras.SANDBOX_INSTALL}): not started; "
                f"the notifications app sends to KEEL_PROVIDER_URL"
            )
        if extras.missing(extras.FLOWER):
            lines.append(f"Flower is not installed ({extras.install('flower')}): not started")
        return lines

    def plan(self, env: dict[str, str]) -> list[Child]:
        # Your app (``--app``, set up with keel.install), else Keel's own
        celery = [sys.executable, "-m", "celery", "-A", env.get("KEEL_CELERY_APP") or "keel"]
        web_bind = f"127.0.0.1:{env['KEEL_WEB_PORT']}"
        return [
            Child("worker", [*celery, "worker", "-l", "INFO", "-n", "worker@%h", "-E"]),
            Child(
                "beat",
                [
                    *celery,
                    "beat",
                    "-l",
                    "INFO",
                    "-S",
                    "tasks.jobs.schedule.beat:KeelScheduler",
                    "--pidfile=",
                ],
            ),
            *self._sandbox(env),
            *self._flower(env),
            Child(
                "web",
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "-c",
                    "python:web.gunicorn_conf",
                    "-b",
                    web_bind,
                    "web:create_app()",
                ],
            ),
        ]

    def run(self) -> int:
        os.umask(PRIVATE_UMASK)
        lock = HomeLock(self.home)
        try:
            lock.acquire()
        except HomeBusy as exc:
            print(f"keel: {exc}", file=sys.stderr)
            return 1
        self.supervisor.output.say(f"starting the stack in {self.home}")
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where is it stuck?
        try:
            stacks.register(self.home)  # `keel` commands in other folders find this stack
            self._start()
            self.starting = False
            return self.supervisor.watch(lambda: self.stopping, self._announce_when_ready)
        except StartRefused as exc:
            print(f"keel: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # a signal while starting: stop what is already up
            return 0
        finally:
            self.starting = False
            self.supervisor.stop_all()
            stacks.unregister(self.home)
            lock.release()

    def _start(self) -> None:
        env = self.environment()
        os.environ.update(env)
        reload_settings()
        self.supervisor.output.say("migrating the database")
        migrate()
        write_env_file(self.home / ENV_FILE_NAME, env)  # atomic: a temporary file, renamed
        # Secrets reach children through their environment, never their command line
        # (``/proc/<pid>/cmdline`` is readable by every local user).
        flower_auth = f"{env['KEEL_FLOWER_USER']}:{env['KEEL_FLOWER_PASSWORD']}"
        child_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "FLOWER_BASIC_AUTH": flower_auth}
        # The console is for people: text lines, prefixed, unless KEEL_LOG_FORMAT asks for JSON
        # (then the supervisor writes JSON lines too, keel.supervisor.Output).
        if not child_env.get("KEEL_LOG_FORMAT"):
            child_env["KEEL_LOG_FORMAT"] = "text"
        if env.get("KEEL_CELERY_APP"):  # celery -A imports it before Keel reads KEEL_JOB_PATH
            paths = [*env.get("KEEL_JOB_PATH", "").split(os.pathsep), child_env.get("PYTHONPATH")]
            child_env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
        self.env = env
        self._next_report = time.monotonic() + READY_REPORT_S
        self._children_started_at = time.monotonic()
        children = self.plan(env)
        for line in self.left_out(env):
            self.supervisor.output.say(line)
        names = ", ".join(child.name for child in children)
        self.supervisor.output.say(f"starting {names}; waiting until the API is ready")
        for child in children:
            child.env, child.cwd = child_env, str(PROJECT_ROOT)
            child.death_signal = DEATH_SIGNALS.get(child.name, signal.SIGTERM)
            self.supervisor.add(child, partial(child.start, self.supervisor.output))

    def _announce_when_ready(self) -> None:
        """Print "Keel is up" once ``/readyz`` says so (probed every second until then)."""
        now = time.monotonic()
        if self.ready or now < self._next_probe:
            return
        self._next_probe = now + READY_PROBE_S
        problem = self._readiness()
        if problem is None:
            self.ready = True
            self._announce(self.env)
        elif now >= self._next_report:
            self._next_report = now + READY_REPORT_S
            self.supervisor.output.say(f"waiting until ready: {problem}")

    def _readiness(self) -> str | None:
        """``/readyz``'s complaint, if any; and the heartbeat must come from *this* worker.

        A worker of the previous run (killed a few seconds ago) is still "recent"
        to ``/readyz``, so a heartbeat older than this start does not count here.
        """
        url = f"{self.env['KEEL_WEB_URL']}/readyz"
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
        try:
            with direct.open(url, timeout=3) as answer:
                stack = answer.headers.get(STACK_HEADER)
        except urllib.error.HTTPError as exc:
            return exc.read().decode(errors="replace")[:300]
        except OSError as exc:
            return f"web not answering ({exc})"
        if stack != self.env["KEEL_STACK_ID"]:  # another program on our port answered
            return (
                f"{url} is answered by another server, not this stack's web app "
                f"(set KEEL_WEB_PORT to a free port)"
            )
        since_start_s = time.monotonic() - self._children_started_at
        try:
            if liveness.fresh(liveness.quick_client(), "worker", within_s=since_start_s):
                return None
        except redis.RedisError as exc:
            return f"redis not answering ({exc})"
        return "no heartbeat yet from a worker of this stack"

    def _announce(self, env: dict[str, str]) -> None:
        sandbox = f"  sandbox {env['KEEL_PROVIDER_URL']}\n" if self._sandbox(env) else ""
        flower = (
            f"  flower  http://127.0.0.1:{env['KEEL_FLOWER_PORT']}"
            f"  (user {env['KEEL_FLOWER_USER']}, password in {self.home / ENV_FILE_NAME})\n"
            if self._flower(env)
            else ""
        )
        text = (
            f"\nKeel is up.\n"
            f"  web     {env['KEEL_WEB_URL']}/api/v1   (docs: /api/v1/docs)\n"
            f"  ui      {env['KEEL_WEB_URL']}/ui   "
            f"(sign in: keel ui-link --tenant acme --user alice --role operator)\n"
            f"{flower}"
            f"{sandbox}"
            f"  env     {self.home / ENV_FILE_NAME}\n"
            f"  token   keel token --tenant acme --user alice --role operator\n"
            f"Ctrl+C stops everything.\n"
        )
        output = self.supervisor.output
        if output.json_lines:  # one JSON line each, like every other line of the console
            for line in text.strip().splitlines():
                output.say(line.strip())
        else:
            print(text, flush=True)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.starting:
            raise KeyboardInterrupt
