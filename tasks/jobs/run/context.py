"""What a handler sees of its job: ``JobContext`` on a worker, ``InProcessJob`` in the
caller's process (``task.apply()``, ``task_always_eager``)."""

from __future__ import annotations

import uuid
from typing import Any, NoReturn

from tasks.jobs.calls.celery_task import CeleryTask
from tasks.jobs.intake import enqueue
from tasks.jobs.intake.enqueue import AddedJob
from tasks.jobs.model import registry
from tasks.jobs.model.options import JobOptions
from tasks.jobs.model.owner import Owner, current_owner
from tasks.jobs.observe import events
from tasks.jobs.run import job_log
from tasks.jobs.store import parents, runs
from tasks.jobs.store.runs import ClaimedJob
from tasks.platform.db import transaction


class JobContext:
    """What a handler sees of its job: data, counters, and progress reporting."""

    def __init__(self, claimed: ClaimedJob) -> None:
        self._claimed = claimed
        self.id = claimed.id
        self.name = claimed.name
        self.queue = claimed.queue
        self.data = claimed.data
        self.opts: JobOptions = claimed.opts
        self.tenant_id = claimed.tenant_id
        self.user_id = claimed.user_id
        self.attempts_made = claimed.attempts_made
        self.attempts_started = claimed.attempts_started

    def update_progress(self, progress: Any) -> None:
        with transaction() as session:
            runs.set_progress(session, self._claimed, progress)
        events.emit_job(self, "progress", data=progress)

    def log(self, message: object) -> int | None:
        """Add a line to the job's log (BullMQ's ``job.log()``), read by ``GET
        /api/v1/jobs/<id>/logs`` and the job's page; its number among the job's lines."""
        return job_log.write(self.id, self.attempts_started, message)

    def is_aborted(self) -> bool:
        """Whether this job is being aborted, or its run no longer counts: stop and return
        (what it returns is not recorded; the job ends ``cancelled``). One query a call."""
        return runs.is_aborted(self._claimed)

    def add_child(
        self,
        name: str,
        data: dict[str, Any],
        *,
        queue: str | None = None,
        opts: JobOptions | None = None,
    ) -> AddedJob:
        """Add a job as this job's child, for the same owner (BullMQ's flow child): a
        ``Defer(..., waiting_children=True)`` then waits for this job's children, and the
        end of the last of them runs this job again at once. ``queue``: the job type's."""
        owner = Owner(self.tenant_id, self.user_id or "") if self.tenant_id else None
        job_type = registry.get(name)
        if queue is None and job_type is None:
            raise ValueError(f"no job type is called {name!r}: give its queue")
        where = queue or job_type.queue  # type: ignore[union-attr]
        return enqueue.add(name, data, queue=where, opts=opts, owner=owner, parent=self.id)

    def children(self) -> list[dict[str, Any]]:
        """This job's children, oldest first: ``id``, ``name``, ``state``, ``result``,
        ``failedReason`` (BullMQ's ``getChildrenValues``, with the failures)."""
        with transaction() as session:
            return parents.children(session, self.id)


class InProcessJob:
    """A ``JobContext`` for a handler run in the caller's process (``task.apply()``,
    ``task_always_eager``): the same fields, nothing recorded; progress is kept here."""

    def __init__(self, task: CeleryTask, data: dict[str, Any]) -> None:
        request = task.request
        owner = current_owner()
        self.id = str(request.id or uuid.uuid4().hex)
        self.name = task.name
        self.queue = task.job_queue()
        self.data = data
        self.opts: JobOptions = task.default_options(data, owner)
        self.tenant_id = owner.tenant_id if owner is not None else None
        self.user_id = owner.user_id if owner is not None else None
        self.attempts_made = int(request.retries or 0)
        self.attempts_started = self.attempts_made + 1
        self.progress: Any = None
        self.logs: list[str] = []

    def update_progress(self, progress: Any) -> None:
        self.progress = progress

    def is_aborted(self) -> bool:
        """Nothing aborts a run in the caller's process."""
        return False

    def add_child(self, name: str, data: dict[str, Any], **_options: Any) -> NoReturn:
        raise RuntimeError(
            "job.add_child needs a worker: a step job does not run in the caller's process"
            " (task.apply(), task_always_eager)"
        )

    def children(self) -> list[dict[str, Any]]:
        """None in the caller's process: children are added by a worker's run only."""
        return []

    def log(self, message: object) -> int:
        """The line goes to this process's log and ``self.logs``; nothing is stored."""
        self.logs.append(job_log.echo(message))
        return len(self.logs)
