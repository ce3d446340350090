"""A Postgres primary, its synchronous standby, and one address in front of them.

For ``tests/chaos/test_postgres_failover.py``.

The embedded Postgres's programs (pgserver's ``pginstall/bin``): ``initdb`` makes the
primary, ``pg_basebackup`` copies it into a streaming standby, ``pg_ctl promote`` promotes
that standby. The primary waits for the standby's flush at every commit
(``synchronous_standby_names``, ``synchronous_commit = on``): an acknowledged commit is on
both servers. Both listen on loopback TCP only. As root they run as the embedded Postgres
runs (``keel.embedded.postgres_server.server_launch``: a user namespace, or pgserver's
account).

Clients reach "the database" at one address, the ``Endpoint``: a TCP forwarder, a process
of its own, that sends each new connection to the server its target file names, as a
managed Postgres's endpoint moves to the promoted standby. Connections already open stay
on the server they reached (when it dies, the forwarder closes their client side).

``python -m tests.support.pg_failover forward PORT TARGET_FILE`` is that forwarder;
``python -m tests.support.pg_failover produce QUEUE COUNT RATE OUT`` is the test's producer
(``produce``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg

from keel.embedded import free_port
from keel.embedded.postgres_server import server_launch
from tasks.platform.lifeline import tied_to_parent
from tests.support.stack import PROJECT_ROOT, TEST_POSTGRES_SETTINGS, wait_for

FORWARDER = (sys.executable, "-m", "tests.support.pg_failover", "forward")
STANDBY_NAME = "standby"  # the standby's application_name, which the primary waits for


def bin_path() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR
        from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def connect(port: int, timeout: int = 2) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=timeout
    )


@dataclass
class Node:
    """One postmaster on ``port``, its data in ``home/name``, in a process group of its own."""

    home: Path
    name: str
    port: int
    process: subprocess.Popen | None = None

    @property
    def pgdata(self) -> Path:
        return self.home / self.name

    @property
    def log_path(self) -> Path:
        return self.home / f"{self.name}.log"

    def run(self, program: str, *args: str) -> None:
        """One of Postgres's programs, as the server runs; its output in the node's log."""
        launch = server_launch()
        with self.log_path.open("ab") as log:
            done = subprocess.run(
                launch.argv(bin_path() / program, *args),
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=tied_to_parent(signal.SIGKILL),
                **launch.popen_kwargs(),
            )
        if done.returncode != 0:
            raise AssertionError(f"{program} {' '.join(args)} failed:\n{self.log_tail()}")

    def start(self, settings: dict[str, str]) -> None:
        launch = server_launch()
        merged = {
            **TEST_POSTGRES_SETTINGS,
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "max_connections": "200",
            **settings,
        }
        args = [arg for name, value in merged.items() for arg in ("-c", f"{name}={value}")]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                launch.argv(bin_path() / "postgres", "-D", str(self.pgdata), *args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=tied_to_parent(signal.SIGINT),
                **launch.popen_kwargs(),
            )
        wait_for(self.answers, timeout=60, interval=0.1)

    def answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited:\n{self.log_tail()}")
        try:
            with connect(self.port) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def kill(self) -> None:
        """SIGKILL the postmaster and every process of the server, as a lost machine: no
        shutdown, no last word. Each backend is a process group of its own, and one that
        outlives the postmaster by a moment notices its death and ends on its own: so the
        postmaster is stopped (it starts and reaps nothing more), its processes are killed,
        then it is."""
        if self.process is None or self.process.poll() is not None:
            return
        postmaster = psutil.Process(self.process.pid)
        postmaster.suspend()
        for process in [*postmaster.children(recursive=True), postmaster]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)  # fast shutdown
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class ReplicatedPair:
    """A primary and its synchronous streaming standby, both on loopback ports."""

    home: Path
    primary: Node | None = None
    standby: Node | None = None

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        launch = server_launch()
        launch.refuse_unreachable(bin_path(), "programs in")
        launch.refuse_unreachable(self.home, "data folder")
        if launch.account is not None:  # no user namespace: the account owns the data
            os.chown(self.home, launch.account.pw_uid, launch.account.pw_gid)
        primary = Node(self.home, "primary", free_port())
        primary.run("initdb", "-D", str(primary.pgdata), "--auth=trust", "-U", "postgres")
        primary.start(
            {"synchronous_standby_names": STANDBY_NAME, "synchronous_commit": "on"},
        )
        standby = Node(self.home, "standby", free_port())
        source = ["-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"]
        primary.run("pg_basebackup", *source, "-D", str(standby.pgdata), "-X", "stream")
        (standby.pgdata / "standby.signal").touch()
        conninfo = (
            f"host=127.0.0.1 port={primary.port} user=postgres application_name={STANDBY_NAME}"
        )
        standby.start({"primary_conninfo": conninfo})
        self.primary, self.standby = primary, standby
        wait_for(self.synchronous, timeout=30, interval=0.1)

    def synchronous(self) -> bool:
        """Whether the primary has the standby as its synchronous standby, streaming."""
        assert self.primary is not None
        with connect(self.primary.port) as conn:
            row = conn.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
        return row == ("streaming", "sync")

    def kill_primary(self) -> None:
        assert self.primary is not None
        self.primary.kill()

    def promote_standby(self) -> Node:
        """``pg_ctl promote``, waiting for the standby to take writes; it is the primary now."""
        assert self.standby is not None
        self.standby.run("pg_ctl", "promote", "-D", str(self.standby.pgdata), "-w", "-t", "60")
        self.primary, self.standby = self.standby, None
        return self.primary

    def stop(self) -> None:
        for node in (self.standby, self.primary):
            if node is not None:
                node.stop()

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
            for path in sorted(self.home.glob("*.log"))
        )


@dataclass
class Endpoint:
    """The database's one address: the forwarder, sending new connections to ``target``."""

    home: Path
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def target_file(self) -> Path:
        return self.home / "endpoint-target"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, target: int) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.point_at(target)
        self.process = subprocess.Popen(
            [*FORWARDER, str(self.port), str(self.target_file)],
            cwd=PROJECT_ROOT,
            stdout=(self.home / "endpoint.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=tied_to_parent(signal.SIGKILL),
        )
        wait_for(self._answers, timeout=30, interval=0.1)

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = (self.home / "endpoint.log").read_text(errors="replace")
            raise AssertionError(f"the forwarder exited:\n{log[-2000:]}")
        try:
            with connect(self.port) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def point_at(self, port: int) -> None:
        """New connections go to ``port`` from now on (the file is replaced whole)."""
        written = self.target_file.with_suffix(".new")
        written.write_text(str(port))
        written.replace(self.target_file)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _forward(
    target_file: Path, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter
) -> None:
    """One client connection, to the server the target file names now. A server that does
    not answer closes the client's connection at once, as a failed-over endpoint does."""
    try:
        server_reader, server = await asyncio.open_connection(
            "127.0.0.1", int(target_file.read_text())
        )
    except OSError:
        client.close()
        return
    await asyncio.gather(_pipe(client_reader, server), _pipe(server_reader, client))


async def forward(port: int, target_file: Path) -> None:
    """Forward every connection to ``127.0.0.1:port``, for ever."""
    listener = await asyncio.start_server(
        lambda r, w: _forward(target_file, r, w), "127.0.0.1", port, reuse_address=True
    )
    async with listener:
        await listener.serve_forever()


@dataclass
class Produced:
    """What the producer wrote: the ids of the adds that returned (accepted jobs), how many
    add calls failed (store unavailable) and were tried again, and the longest time one add
    took to be accepted."""

    ids: list[str]
    failed_tries: int
    longest_add_s: float


RETRY_PAUSE_S = 0.2
GIVE_UP_S = 120.0


def add_until_accepted(queue: str, job_id: str, ms: int) -> int:
    """Add a job of ``test.sleep`` with this id, again after a pause while the store is
    unavailable; how many tries failed. The id makes trying again safe: an add whose commit
    happened though its answer was lost is found (an existing ``jobId`` adds nothing)."""
    from tasks.jobs import JobOptions, add
    from tasks.platform.db import STORE_UNAVAILABLE, passing

    failed, deadline = 0, time.monotonic() + GIVE_UP_S
    while True:
        try:
            add("test.sleep", {"ms": ms}, queue=queue, opts=JobOptions(job_id=job_id))
            return failed
        except STORE_UNAVAILABLE as exc:
            if not passing(exc) or time.monotonic() > deadline:
                raise
            failed += 1
            time.sleep(RETRY_PAUSE_S)


def produce(queue: str, count: int, rate: float, out: Path) -> None:
    """Add ``count`` jobs of 20 ms on ``queue``, ``rate`` a second; write ``Produced`` to
    ``out`` as JSON when done."""
    import tests.support.jobs  # noqa: F401  the suite's job types

    ids: list[str] = []
    failed, longest = 0, 0.0
    for n in range(count):
        time.sleep(max(0.0, 1 / rate - 0.002))
        began = time.monotonic()
        job_id = f"{queue}-{n}-{uuid.uuid4().hex[:8]}"
        failed += add_until_accepted(queue, job_id, ms=20)
        longest = max(longest, time.monotonic() - began)
        ids.append(job_id)
    out.write_text(json.dumps({"ids": ids, "failed_tries": failed, "longest_add_s": longest}))


if __name__ == "__main__":
    if sys.argv[1] == "forward":
        asyncio.run(forward(int(sys.argv[2]), Path(sys.argv[3])))
    elif sys.argv[1] == "produce":
        produce(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
