"""``install(app)``: a Celery app becomes a Keel app, keeping its own configuration.

What it changes on the app, and nothing else:

- **Its tasks are Keel tasks**: the app's default task class is ``KeelTask``, so
  ``@app.task`` and ``@shared_task`` without ``base=`` are recorded, retried through
  the record, visible in Keel's API. Celery's own tasks (``celery.chord_unlock``,
  ``celery.backend_cleanup``, the canvas helpers) stay plain Celery tasks, and so does
  a task declared with ``base=celery.Task``.
- **Its settings**, once the app is configured (``on_after_configure``, or at once if
  it already is): what Keel's semantics rest on (``tasks.celeryconfig.owned``) is set
  whatever the app said, with a warning naming each value it replaced; where the app
  left a setting unset, Keel's choice applies (``defaults``); a setting
  Keel cannot run with (a serializer other than JSON, a broker that is not Keel's) is
  refused at start, in one line saying which and why (``KeelAppRefused``). The app's
  own queues, routes, ``beat_schedule``, ``include`` and ``imports`` are kept; Keel's
  queues and job modules are added to them.
- **Its workers and beat** run Keel's bootsteps (maintenance, the commit listener,
  heartbeat, prefetch watch), Keel's event dispatcher and beat scheduler (which fires the app's
  ``beat_schedule`` too).

The app becomes the process's default app and the one the job layer publishes on
(``tasks.platform.celery_app``). One Keel app per process. Keel's own app is
``install(Celery("keel"))`` (``tasks.celery``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import Celery, Task
from celery.signals import celeryd_after_setup, setup_logging, worker_process_shutdown
from kombu import Queue

from tasks import celeryconfig
from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs.model import registry
from tasks.jobs.observe import events
from tasks.jobs.run import aio
from tasks.platform import celery_app
from tasks.platform.catalog import job_modules
from tasks.platform.config import get_settings
from tasks.platform.deadletters import dead_lettered
from tasks.platform.errors import KeelError

log = logging.getLogger(__name__)

TASK_CLASS = "tasks.jobs.run.execute:KeelTask"
EVENTS_CLASS = "tasks.platform.celery_events:KeelEvents"
CELERY_OWN = "celery."  # the names of Celery's built-in tasks
BOOTSTEPS = {
    "worker": (
        "tasks.jobs.upkeep.maintenance:Maintenance",
        "tasks.jobs.upkeep.committed:CommitListener",
    ),
    "consumer": ("tasks.jobs.upkeep.liveness:Heartbeat", "tasks.jobs.run.slots:PrefetchWatch"),
}


class KeelAppRefused(KeelError):
    """This Celery app cannot be a Keel app as configured."""


def install(app: Celery) -> Celery:
    """Make ``app`` a Keel app, keeping its own configuration; returns it."""
    current = celery_app.installed()
    if current is not None and current is not app:
        raise KeelAppRefused(
            f"Keel already runs on the Celery app {current.main!r} in this process: "
            f"one Keel app per process, so {app.main!r} cannot be one too"
        )
    if current is app:
        return app
    if app.finalized:
        raise KeelAppRefused(
            f"the Celery app {app.main!r} already made its tasks: call keel.install(app) "
            "right after Celery(...), before any task is used"
        )
    _adopt_task_class(app)
    app.events_cls = EVENTS_CLASS
    app.__dict__.pop("events", None)  # built from the previous class, if ever used
    for kind, steps in BOOTSTEPS.items():
        for step in steps:  # named, not imported: Celery loads bootsteps by name
            app.steps[kind].add(step)
    if app.configured:
        configure(app)
    else:
        app.on_after_configure.connect(_configure_once, sender=app, weak=False)
    # Every thread's current app, not only this one's: Celery keeps the current app per
    # thread, and a thread that never set one (a gunicorn or Flask request thread) would
    # resolve a ``@shared_task`` against Celery's fallback app, whose default queue no
    # Keel worker consumes.
    app.set_default()
    celery_app.set_app(app)
    # A dead letter the transport sets aside is an event on its queue's stream.
    dead_lettered.connect(events.dead_letter_event, weak=False)
    return app


def _adopt_task_class(app: Celery) -> None:
    """``KeelTask`` as the app's default task class; Celery's own tasks keep ``Task``."""
    app.task_cls = TASK_CLASS
    app.__dict__.pop("Task", None)  # the class Celery built from the previous task_cls
    make_task = app._task_from_fun

    def task_from_fun(fun: Any, name: str | None = None, base: Any = None, **options: Any):
        if base is None and (name or "").startswith(CELERY_OWN):
            base = Task
        elif aio.is_async(fun):  # run on its thread's loop (``tasks.jobs.run.aio``)
            fun = aio.async_run(fun)
        return make_task(fun, name=name, base=base, **options)

    app._task_from_fun = task_from_fun


def _configure_once(sender: Celery, **kwargs: Any) -> None:
    try:
        configure(sender)
    except KeelAppRefused as exc:  # Celery logs a receiver's Exception and goes on: not this
        raise SystemExit(f"keel: {exc}") from None


def configure(app: Celery) -> None:
    """Apply Keel's settings to the configured ``app`` (see the module's docstring)."""
    settings = get_settings()
    conf = app.conf
    _refuse_what_keel_cannot_run_with(app, settings)
    for key, value in celeryconfig.defaults(settings).items():
        if key == "task_queues":
            conf.task_queues = _with_queues(conf.task_queues, value)
        elif key == "broker_transport_options":
            conf.broker_transport_options = {**(conf.broker_transport_options or {}), **value}
        elif not _set_by_app(conf, key):
            conf[key] = value
    for key, value in celeryconfig.owned(settings).items():
        if _set_by_app(conf, key) and conf.get(key) != value:
            log.warning(  # (a result backend's URL carries its password: not in the log)
                "Keel sets %s=%s on the Celery app %r (it had %s): %s",
                key,
                _redacted(repr(value)),
                app.main,
                _redacted(repr(conf.get(key))),
                "Keel's jobs rely on it",
            )
        conf[key] = value
    own = [module for module in job_modules() if module not in (conf.include or ())]
    conf.include = (*(conf.include or ()), *own)


def _set_by_app(conf: Any, key: str) -> bool:
    """Whether the app's configuration gives ``key`` (under its namespace or an old name)."""
    return bool(conf.value_set_for(key))


def _refuse_what_keel_cannot_run_with(app: Celery, settings: Any) -> None:
    conf = app.conf
    for key, (needed, why) in celeryconfig.REFUSED.items():
        if _set_by_app(conf, key) and conf.get(key) != needed:
            raise KeelAppRefused(
                f"the Celery app {app.main!r} sets {key}={conf.get(key)!r}: Keel needs "
                f"{needed!r} ({why})"
            )
    accepted = conf.get("accept_content")
    if _set_by_app(conf, "accept_content") and "json" not in (accepted or ()):
        raise KeelAppRefused(
            f"the Celery app {app.main!r} accepts only {accepted!r}: Keel's messages are JSON"
        )
    wanted = celeryconfig.broker_options(settings)["broker_url"]
    given = conf.get("broker_url")
    if given and wanted and _set_by_app(conf, "broker_url") and given != wanted:
        raise KeelAppRefused(
            f"the Celery app {app.main!r} uses the broker {_redacted(given)}, Keel "
            f"{_redacted(wanted)}: set KEEL_REDIS_URL (or KEEL_BROKER_URL for RabbitMQ) "
            "to the app's broker, or leave broker_url unset and Keel's applies"
        )


def _redacted(text: str) -> str:
    """``text`` without the passwords of the URLs in it (``tasks.platform.logs.redact``)."""
    from tasks.platform.logs import redact

    return redact(text)


def _with_queues(given: Any, keel: list[Queue]) -> list[Queue]:
    """The app's own queues, and Keel's that it does not declare."""
    mine = list(given or ())
    names = {queue.name for queue in mine}
    return [*mine, *(queue for queue in keel if queue.name not in names)]


@setup_logging.connect
def keel_logging(loglevel: Any = None, **kwargs: Any) -> None:
    """Celery's worker, beat and Flower log Keel's way (``tasks.platform.logs``): connecting
    here keeps Celery from configuring logging itself. ``-l`` counts when ``KEEL_LOG_LEVEL``
    is unset. They trace here too, if asked to (``tasks.platform.tracing``)."""
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
    runs made are exported here, or never (``tasks.platform.tracing``; nothing when tracing
    is off), and so are the job metrics it counted (``tasks.platform.tallies``)."""
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
    queues = instance.app.amqp.queues
    # -Q (or -X) chose the queues: Celery's Queues then keep a selection of their own. (Not
    # "consume_from differs from the queues": routing a task to a queue nobody declared adds
    # it to the queues, not to what the worker consumes.)
    if getattr(queues, "_consume_from", None) is not None:
        return
    load_job_modules()
    for name in registry.queues():
        if name not in queues.consume_from:
            # Declared as a publisher declares a queue it has not heard of (quorum on
            # RabbitMQ): a queue declared twice must be declared alike.
            queues.select_add(queues[name] if name in queues else queues.new_missing(name))
