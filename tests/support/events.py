"""Reading the queue event streams from the test process (another process than the worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from tasks.jobs import events
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
