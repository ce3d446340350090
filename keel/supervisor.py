"""The processes behind ``keel up``: started, watched, restarted, stopped.

A *unit* is a child command (worker, beat, Flower, sandbox, web) or an
embedded server; both answer ``poll()`` with an exit code once they have
died. Children are tied to the supervisor (``tasks.platform.lifeline``), so
a ``kill -9`` of ``keel up`` takes them along; their output reaches the
supervisor's stdout line by line, prefixed with their name the way foreman
and honcho do it.

A unit that dies while the stack runs is restarted after a growing pause
(``RestartPolicy``); the stack stops, loudly and with a non-zero exit, only
when one keeps dying right after each start.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Protocol

from tasks.platform.lifeline import tied_to_parent

RESTART_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0)
STABLE_AFTER_S = 60.0
STOP_TIMEOUT_S = 60.0
TICK_S = 0.2


class Unit(Protocol):
    """A child or an embedded server: anything with a name that can report its death."""

    name: str

    def poll(self) -> int | None: ...


class Output:
    """One stream for every child: ``12:00:01 worker  | line``.

    With ``KEEL_LOG_FORMAT=json`` (``json_lines``), a stream of JSON objects instead, one per
    line: a child's JSON log line as it is (it names its ``process``), any other line —
    a banner, a server's output, the supervisor's own — wrapped in one
    (``{"time", "level", "logger": "keel.output", "process", "message"}``).
    """

    def __init__(
        self, stream: IO[bytes] | None = None, width: int = 8, json_lines: bool | None = None
    ) -> None:
        self.stream = stream or sys.stdout.buffer
        self.width = width
        if json_lines is None:
            json_lines = os.environ.get("KEEL_LOG_FORMAT", "").strip().lower() == "json"
        self.json_lines = json_lines
        self._lock = threading.Lock()

    def line(self, name: str, text: bytes) -> None:
        body = text.rstrip(b"\r\n")
        if self.json_lines:
            written = body if _json_object(body) else _wrapped(name, body)
        else:
            written = f"{time.strftime('%H:%M:%S')} {name:<{self.width}}| ".encode() + body
        with self._lock:
            self.stream.write(written + b"\n")
            self.stream.flush()

    def say(self, text: str) -> None:
        self.line("keel", text.encode())

    def pump(self, name: str, pipe: IO[bytes]) -> threading.Thread:
        """Copy ``pipe`` line by line until it closes (the child and its children exited)."""

        def copy() -> None:
            with pipe:
                for raw in iter(pipe.readline, b""):
                    self.line(name, raw)

        thread = threading.Thread(target=copy, name=f"keel-output-{name}", daemon=True)
        thread.start()
        return thread


def _json_object(line: bytes) -> bool:
    if not line.startswith(b"{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _wrapped(name: str, line: bytes) -> bytes:
    moment = datetime.now(UTC).isoformat(timespec="milliseconds")
    record = {
        "time": moment,
        "level": "INFO",
        "logger": "keel.output",
        "process": name,
        "message": line.decode(errors="replace"),
    }
    return json.dumps(record).encode()


@dataclass
class Child:
    """One command of the stack, in its own session (its process group is ours to kill)."""

    name: str
    args: list[str]
    env: dict[str, str] | None = None
    cwd: str | None = None
    death_signal: int = signal.SIGTERM  # what it gets if the supervisor dies
    process: subprocess.Popen | None = None

    def start(self, output: Output) -> None:
        """Spawn; call from the main thread (the death signal is tied to the spawning thread)."""
        self.process = subprocess.Popen(
            self.args,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=tied_to_parent(self.death_signal),
        )
        assert self.process.stdout is not None
        output.pump(self.name, self.process.stdout)

    def poll(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic), then kill its whole process group."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@dataclass
class RestartPolicy:
    """When to start a dead unit again, and when to stop trying."""

    delays_s: tuple[float, ...] = RESTART_DELAYS_S
    stable_after_s: float = STABLE_AFTER_S
    failures: int = 0

    def after_exit(self, ran_for_s: float) -> float | None:
        """Seconds to wait before the next start; ``None``: it keeps dying, give up."""
        if ran_for_s >= self.stable_after_s:
            self.failures = 0  # it ran fine for a while: a new, unrelated failure
        if self.failures >= len(self.delays_s):
            return None
        delay = self.delays_s[self.failures]
        self.failures += 1
        return delay


@dataclass
class Watched:
    """A unit, how to start it, and its restart history."""

    unit: Unit
    start: Callable[[], object]
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    started_at: float = field(default_factory=time.monotonic)
    restart_at: float | None = None


class Supervisor:
    """Keeps a list of units alive until asked to stop, then stops them in reverse order."""

    def __init__(self, output: Output | None = None) -> None:
        self.output = output or Output()
        self.watched: list[Watched] = []

    def add(self, unit: Unit, start: Callable[[], object], *, running: bool = False) -> None:
        """Watch ``unit``; ``start`` (re)starts it. Already ``running`` units are not started."""
        if not running:
            start()
        self.watched.append(Watched(unit, start))

    def watch(self, stopping: Callable[[], bool], tick: Callable[[], None]) -> int:
        """Until ``stopping()``: restart what died; 1 if a unit keeps dying, else 0."""
        while not stopping():
            for item in self.watched:
                if not self._keep_alive(item):
                    return 1
            tick()
            time.sleep(TICK_S)
        return 0

    def _keep_alive(self, item: Watched) -> bool:
        now = time.monotonic()
        name = item.unit.name
        if item.restart_at is not None:
            if now < item.restart_at:
                return True
            item.restart_at, item.started_at = None, now
            try:
                item.start()
                self.output.say(f"{name} restarted")
                return True
            except Exception as exc:
                self.output.say(f"{name} did not start: {exc}")
                return self._schedule(item, 0.0, "failed to start")
        code = item.unit.poll()
        if code is None:
            return True
        return self._schedule(item, now - item.started_at, f"exited with code {code}")

    def _schedule(self, item: Watched, ran_for_s: float, what: str) -> bool:
        delay = item.policy.after_exit(ran_for_s)
        name = item.unit.name
        if delay is None:
            self.output.say(
                f"{name} {what}; it died {item.policy.failures + 1} times in a row "
                "right after starting: giving up, stopping the stack"
            )
            return False
        count = f"restart {item.policy.failures} of {len(item.policy.delays_s)}"
        self.output.say(
            f"{name} {what} after {ran_for_s:.1f} s; next start in {delay:g} s ({count})"
        )
        item.restart_at = time.monotonic() + delay
        return True

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Children first (SIGTERM together, newest first, kill at the deadline), then servers."""
        units = [item.unit for item in reversed(self.watched)]
        children = [unit for unit in units if isinstance(unit, Child)]
        for child in children:
            child.terminate()
        deadline = time.monotonic() + timeout_s
        for child in children:
            child.wait(deadline)
        for unit in units:
            if not isinstance(unit, Child):
                unit.stop()  # type: ignore[attr-defined]
