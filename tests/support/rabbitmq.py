"""A private RabbitMQ node for the tests, or the one ``KEEL_TEST_AMQP_URL`` names.

The node is the machine's ``rabbitmq-server``, started as a child of the test
process with everything of its own: node name ``keel-<random>@localhost``,
AMQP and distribution ports, Erlang port mapper port, data, log and config
in a temporary folder, and an Erlang cookie in a ``HOME`` of its own. A
RabbitMQ the machine already runs is neither used nor touched. The scripts
are run from RabbitMQ's own folder (``/usr/lib/rabbitmq/bin``) when there is
one: Debian's wrappers on ``PATH`` switch to the ``rabbitmq`` user and its
home, and so to the system node's cookie.

A node given by ``KEEL_TEST_AMQP_URL`` is used as it is; tests that stop or
freeze the broker skip on it (it is not ours to stop).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from amqp.exceptions import PreconditionFailed
from kombu import Connection, pools

from keel.embedded import free_port
from tasks.platform.config import get_settings, reload_settings
from tests.support import kept_logs

SCRIPT_DIRS = (Path("/usr/lib/rabbitmq/bin"), Path("/usr/lib/rabbitmq/sbin"))
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 60


def script(name: str) -> str | None:
    """The RabbitMQ script ``name`` to run as this user (not a wrapper that switches users)."""
    for folder in SCRIPT_DIRS:
        if (folder / name).exists():
            return str(folder / name)
    return shutil.which(name)


def amqp_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether an AMQP handshake with ``url`` completes within ``timeout``."""
    try:
        with Connection(url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=0)
        return True
    except Exception:
        return False


@dataclass
class RabbitNode:
    """One private RabbitMQ node: start, stop, restart, freeze; removed with its folder."""

    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="keel-rabbitmq-")))
    name: str = field(default_factory=lambda: f"keel-{secrets.token_hex(4)}@localhost")
    port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    epmd_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def log_path(self) -> Path:
        return self.folder / "server.log"

    def env(self) -> dict[str, str]:
        home = self.folder / "home"
        return {
            **os.environ,
            "HOME": str(home),  # the Erlang cookie: this node's own
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.folder / "node.pid"),
        }

    def prepare(self) -> None:
        home = self.folder / "home"
        for sub in (home, self.folder / "mnesia", self.folder / "log"):
            sub.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20))
        cookie.chmod(0o400)
        # A test machine's disk may be fuller than RabbitMQ's default alarm allows.
        (self.folder / "rabbitmq.conf").write_text(
            "disk_free_limit.absolute = 50MB\nlog.console = false\n"
        )
        (self.folder / "rabbitmq-env.conf").write_text("")  # not the system's
        (self.folder / "enabled_plugins").write_text("[].\n")

    def start(self) -> None:
        server = script("rabbitmq-server")
        if server is None:
            pytest.skip("rabbitmq-server is not installed (or give KEEL_TEST_AMQP_URL)")
        if not (self.folder / "home").exists():
            self.prepare()
        self.process = subprocess.Popen(
            [server],
            env=self.env(),
            cwd=self.folder,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not amqp_answers(self.url, timeout=1):
            if self.process.poll() is not None:
                raise AssertionError(f"rabbitmq-server exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"RabbitMQ not up in {START_TIMEOUT_S} s:\n{self.log_tail()}")
            time.sleep(0.3)

    def ctl(self, *args: str, timeout: float = STOP_TIMEOUT_S) -> subprocess.CompletedProcess:
        """``rabbitmqctl -n <node> …`` against this node."""
        command = script("rabbitmqctl") or "rabbitmqctl"
        return subprocess.run(
            [command, "-q", "-n", self.name, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def stop(self) -> None:
        """A clean shutdown (``rabbitmqctl stop``); the data folder stays for the next start."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.ctl("stop")
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def freeze(self) -> None:
        """SIGSTOP the node: its sockets stay open and nothing answers."""
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGCONT)

    def remove(self) -> None:
        """Stop the node and its port mapper, and delete its folder."""
        try:
            self.stop()
        finally:
            self.kill()
            epmd = shutil.which("epmd")
            if epmd is not None:  # the port mapper the node started on its private port
                subprocess.run(
                    [epmd, "-port", str(self.epmd_port), "-kill"],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
            kept_logs.keep(self.folder, self.folder.name)  # if KEEL_TEST_LOG_DIR is set
            shutil.rmtree(self.folder, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def queue_depth(url: str, queue: str) -> int:
    """Messages ready in ``queue`` (a passive declare: nothing is created or taken)."""
    with Connection(url, connect_timeout=5) as conn:
        _, count, _ = conn.default_channel.queue_declare(queue, passive=True)
    return int(count)


def is_quorum(url: str, queue: str) -> bool:
    """Whether the existing ``queue`` is a quorum queue (asked over AMQP, nothing changed).

    RabbitMQ refuses to declare a queue again with other arguments, so
    declaring it as a quorum queue succeeds only if it is one.
    """
    with Connection(url, connect_timeout=5) as conn:
        conn.default_channel.queue_declare(queue, passive=True)  # it exists (else: an error)
        try:
            conn.default_channel.queue_declare(
                queue, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
            )
        except PreconditionFailed:
            return False
    return True


@contextmanager
def using_broker(url: str) -> Iterator[None]:
    """Inside the block, this process sends Celery's messages to ``url`` (``KEEL_BROKER_URL``).

    The settings are read again and Celery's broker settings replaced by what
    ``tasks.celeryconfig`` makes of them; the publisher pools and queue
    declarations built for the previous broker are dropped. Processes started
    inside the block inherit the variable.
    """
    from tasks.celery import app
    from tasks.celeryconfig import broker_options

    previous_url = os.environ.get("KEEL_BROKER_URL")
    current = broker_options(get_settings())
    os.environ["KEEL_BROKER_URL"] = url
    wanted = broker_options(reload_settings())
    previous = {key: app.conf[key] for key in {*current, *wanted}}
    _switch(app, wanted)
    try:
        yield
    finally:
        if previous_url is None:
            os.environ.pop("KEEL_BROKER_URL", None)
        else:
            os.environ["KEEL_BROKER_URL"] = previous_url
        reload_settings()
        _switch(app, previous)


def _switch(app: Any, options: dict[str, Any]) -> None:
    pools.reset()  # kombu's process-wide connection and producer pools, of either broker
    app._pool = None
    app.conf.update(options)
    app.__dict__.pop("amqp", None)  # queues, router and producer pool of the old broker
