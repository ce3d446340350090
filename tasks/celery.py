"""The Celery application: ``celery -A tasks worker|beat|flower``."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task
from celery.signals import celeryd_after_setup, setup_logging, worker_process_shutdown

from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs.model import registry
from tasks.jobs.observe import events
from tasks.platform.catalog import job_modules
from tasks.platform.celery_app import set_app
from tasks.platform.deadletters import dead_lettered

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
    events="tasks.platform.celery_events:KeelEvents",
    task_cls="tasks.jobs.run.execute:KeelTask",
)
app.config_from_object("tasks.celeryconfig")
# Every thread's current app, not only this one's: Celery keeps the current app per thread,
# and a thread that never set one (a gunicorn or Flask request thread) would resolve a
# ``@shared_task`` against Celery's fallback app — its default queue "celery", which no
# Keel worker consumes. Keel's app is the process's default.
app.set_default()
set_app(app)  # the app the job layer publishes on (``tasks.platform.celery_app``)
# A dead letter the transport sets aside is an event on its queue's stream.
dead_lettered.connect(events.dead_letter_event, weak=False)
# Named, not imported: Celery loads its bootsteps by name, when a worker starts.
app.steps["worker"].add("tasks.jobs.upkeep.maintenance:Maintenance")
app.steps["consumer"].add("tasks.jobs.upkeep.liveness:Heartbeat")
app.steps["consumer"].add("tasks.jobs.run.slots:PrefetchWatch")


@setup_logging.connect
def keel_logging(loglevel: Any = None, **kwargs: Any) -> None:
    """Celery's worker, beat and Flower log Keel's way (``tasks.platform.logs``): connecting here
    keeps Celery from configuring logging itself. ``-l`` counts when ``KEEL_LOG_LEVEL`` is
    unset. They trace here too, if asked to (``tasks.platform.tracing``)."""
    import sys

    from tasks.platform import logs, tracing

    command = next((arg for arg in sys.argv[1:] if arg in ("worker", "beat", "flower")), "worker")
    logs.configure(command, level=loglevel)
    try:
        tracing.configure(command)  # before the pool forks (OTEL_TRACES_EXPORTER: off unless set)
    except ValueError as exc:  # Celery logs a receiver's Exception and goes on: not this one
        sys.exit(f"keel: {exc}")


@worker_process_shutdown.connect
def flush_spans(**kwargs: Any) -> None:
    """A prefork pool process ends with ``os._exit``: no ``atexit``, so the spans its last
    runs made are exported here, or never (``tasks.platform.tracing``; nothing when tracing is off),
    and so are the job metrics it counted (``tasks.platform.tallies``)."""
    from tasks.jobs.observe import metrics
    from tasks.platform import tracing

    tracing.flush()
    metrics.TALLY.close()


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
