"""The Celery application: ``celery -A tasks worker|beat|flower``."""

from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

from celery import Celery, Task
from celery.signals import celeryd_after_setup

from tasks.catalog import job_modules
from tasks.jobs.model import registry

log = logging.getLogger(__name__)


class KeelCelery(Celery):
    """Celery, with Keel's task class as every task's default base.

    ``@app.task`` and ``@shared_task`` without ``base=`` are Keel tasks (recorded,
    retried through the record); a task that must bypass the records says so with
    ``base=celery.Task``. Celery's own tasks (``celery.chord_unlock``,
    ``celery.backend_cleanup``, the canvas helpers) stay plain Celery tasks.
    """

    def _task_from_fun(self, fun: Any, name: str | None = None, base: Any = None, **options: Any):
        if base is None and (name or "").startswith(CELERY_OWN):
            base = Task
        return super()._task_from_fun(fun, name=name, base=base, **options)


CELERY_OWN = "celery."  # the names of Celery's built-in tasks
app = KeelCelery(
    "keel",
    include=job_modules(),
    events="tasks.celery_events:KeelEvents",
    task_cls="tasks.jobs.run.execute:KeelTask",
)
app.config_from_object("tasks.celeryconfig")
# Named, not imported: Celery loads its bootsteps by name, and the job layer they
# come from imports this app (to publish) — nothing here imports it back.
app.steps["worker"].add("tasks.jobs.upkeep.maintenance:Maintenance")
app.steps["consumer"].add("tasks.jobs.upkeep.liveness:Heartbeat")
app.steps["consumer"].add("tasks.jobs.run.slots:PrefetchWatch")


def load_job_modules() -> list[str]:
    """Import every job module and bind every task (idempotent); the declared job names.

    Binding declares Celery-style Keel tasks (``KeelTask.on_bound``), so a
    process that never runs a worker — the API, the CLI — knows them too.
    """
    for module in app.conf.include:
        import_module(module)
    app.finalize(auto=True)
    return registry.names()


@celeryd_after_setup.connect
def consume_every_job_queue(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """A worker started without ``-Q`` consumes the queue of every job type it knows.

    Queues come from the tasks (``@app.task(queue=...)``, ``handler(queue=...)``):
    a module of your own adds its queues by being loaded, not by a list in Keel.
    """
    if instance is None:
        return
    load_job_modules()
    queues = instance.app.amqp.queues
    if set(queues.consume_from) != set(queues):  # -Q (or -X) chose the queues
        return
    for name in registry.queues():
        if name not in queues:
            # Declared as a publisher declares a queue it has not heard of (quorum on
            # RabbitMQ): a queue declared twice must be declared alike.
            queues.select_add(queues.new_missing(name))
