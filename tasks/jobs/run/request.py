"""``KeelRequest``: Celery's request for a Keel job, whose run can end in the pool's hands.

Two ends of a run happen outside the task's own code, in the worker's parent process:
the pool kills a process past its hard time limit (``tasks.jobs.run.timeouts``), and a
worker kills one to abort its job (``tasks.jobs.run.termination``). Celery would fail the
task in both, calling its errbacks, and for the second requeue its message as a lost
run. Here each is recorded in the job's record, as the job's rules say.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.exceptions import TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request

from tasks.jobs.run import termination
from tasks.jobs.run.timeouts import record_timeout

log = logging.getLogger(__name__)


class KeelRequest(Request):
    """Celery's request, whose hard time limit or abort ends a Keel job's run in its record.

    On a hard limit the pool calls ``on_failure`` (with ``TimeLimitExceeded``), then
    ``on_timeout``, then kills the process. Celery fails the task in both; here the first
    only lets the message go and the second records the run's end. A process this worker
    killed to abort its job comes back as ``WorkerLostError``: its job is already
    cancelled, and the message is let go.
    """

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = exc_info.exception
        exc = exc.exc if isinstance(exc, ExceptionWithTraceback) else exc
        if isinstance(exc, WorkerLostError) and termination.was_stopped(self.id, self.worker_pid):
            # Killed to abort its job, which ended cancelled: not a lost run to requeue.
            worker_state.task_ready(self)
            if self.task.acks_late:
                self.acknowledge()
            self.send_event("task-revoked", terminated=True, signum="SIGKILL", expired=False)
            return None
        # The pool's hard limit (``return_ok`` False): not a late return or a handler's
        # own re-raise, which come from the process's result like any failure.
        if (
            isinstance(exc, TimeLimitExceeded)
            and not return_ok
            and not worker_state.should_terminate
        ):
            worker_state.task_ready(self)
            if self.task.acks_late:  # its next run, if any, has a message of its own
                self.acknowledge()
            return None
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft or worker_state.should_terminate:
            super().on_timeout(soft, timeout)
            return
        # Stopped first: recorded failed or due again, the run must not be going on.
        # (billiard's own kill comes after this callback, and finds it ended.)
        if self.worker_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.worker_pid, signal.SIGKILL)
        final = record_timeout(self.id, self.hostname, self.worker_pid, timeout)
        if final:  # Celery's failure handling: errbacks, task_failure, task-failed
            super().on_timeout(soft, timeout)
            return
        log.warning(
            "Hard time limit (%ss) exceeded for %s[%s]: %s",
            timeout,
            self.name,
            self.id,
            "it runs again by its job's rules"
            if final is False
            else "no active run to record (it had ended, was taken over or aborted)",
        )
