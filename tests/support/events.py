"""Reading the queue event streams, and Celery's events, from the test process (another
process than the worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tasks.celery import app
from tasks.jobs.observe import events
from tests.support.stack import wait_for


def of_job(queue: str, job_id: str) -> list[dict]:
    return [e for e in events.read([queue]) if e["jobId"] == job_id]


def names(queue: str, job_id: str) -> list[str]:
    return [e["event"] for e in of_job(queue, job_id)]


class EventFollower:
    """``keel events --follow`` in its own process, its JSON lines collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.args = list(args)
        self.lines: list[dict] = []
        self.process: subprocess.Popen | None = None

    def start(self) -> EventFollower:
        keel = str(Path(sys.executable).with_name("keel"))
        self.process = subprocess.Popen(
            [keel, "events", *self.args, "--follow"],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # the command says on stderr where it starts reading once it is connected
        ready = self.process.stderr.readline() if self.process.stderr else ""
        assert ready.startswith("keel: events of"), ready
        threading.Thread(target=self._collect, daemon=True).start()
        return self

    def _collect(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def of_job(self, job_id: str) -> list[dict]:
        return [e for e in list(self.lines) if e.get("jobId") == job_id]

    def wait_for_event(self, job_id: str, event: str, timeout: float = 30) -> list[dict]:
        """The job's events seen so far, once ``event`` is among them."""

        def seen_with_event() -> list[dict] | None:
            seen = self.of_job(job_id)
            return seen if any(e["event"] == event for e in seen) else None

        return wait_for(seen_with_event, timeout=timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@dataclass
class Heard:
    """Celery's events as Flower receives them: each event, and each broker message's batch."""

    events: list[dict] = field(default_factory=list)
    messages: list[list[dict]] = field(default_factory=list)


@contextmanager
def celery_events() -> Iterator[Heard]:
    """Every Celery event on the broker while the block runs, from once a probe came back."""
    heard = Heard()

    class Recording(app.events.Receiver):  # type: ignore[name-defined,misc]
        def _receive(self, body: object, message: object, *rest: object) -> None:
            heard.messages.append(body if isinstance(body, list) else [body])
            super()._receive(body, message, *rest)

    with app.connection_for_read() as connection:
        receiver = Recording(connection, handlers={"*": heard.events.append})
        listening = threading.Thread(target=receiver.capture, kwargs={"limit": None}, daemon=True)
        listening.start()
        try:
            probe = f"probe-{uuid.uuid4().hex}"

            def hears_a_probe() -> bool:
                with app.events.default_dispatcher() as dispatcher:
                    dispatcher.send("worker-probe", probe=probe)
                return any(e.get("probe") == probe for e in heard.events)

            wait_for(hears_a_probe, timeout=20, interval=0.2)
            yield heard
        finally:
            receiver.should_stop = True
            listening.join(timeout=5)
