"""The Celery settings Keel runs with, applied by ``install`` (``tasks.celery``).

``owned``: what Keel's semantics rest on, set on every Keel app whatever the app's
own configuration says (``install`` adapts a differing value with a log line, or
refuses the app when Keel cannot run with it: ``REFUSED``). ``defaults``: Keel's
choice where the app has none of its own.

Acks are late and a lost worker's message is rejected back to the queue;
prefetch is one so a busy worker does not sit on other jobs. Results live in
Keel's job records, so Celery's result backend is off. Task events are on so
Flower sees every job.

Messages go through Keel's Redis, or through RabbitMQ when
``KEEL_BROKER_URL`` is an AMQP URL (``broker_options``); everything else Keel
keeps in Redis either way.
"""

from __future__ import annotations

from typing import Any

from celery.signals import beat_init, worker_init
from kombu import Exchange, Queue

from tasks.jobs.intake.tenancy import PRIORITY_STEPS
from tasks.platform import broker
from tasks.platform.catalog import celery_queues
from tasks.platform.config import Settings
from tasks.platform.rabbitmq import CONFIRM_TIMEOUT_S
from tasks.platform.redis_url import RedisTarget

# The built-in apps' queues that are on (KEEL_BUILTIN_JOBS), and "default".
QUEUES = celery_queues()


def redis_target(settings: Settings) -> RedisTarget | None:
    """``KEEL_REDIS_URL`` parsed, or None while it is unset (Celery says so on use)."""
    return settings.redis_target if settings.redis_url else None


def redis_broker(settings: Settings) -> dict[str, Any]:
    """Celery's broker settings when its messages go through Redis (the default).

    Through Redis Sentinel (a ``sentinel://`` URL), Keel's Sentinel transport and the
    primary's name; over TLS (``rediss://``), the URL's TLS options as ``broker_use_ssl``
    (``tasks.platform.redis_url``)."""
    target = redis_target(settings)
    sentinel = target is not None and target.is_sentinel
    transport = "SentinelTransport" if sentinel else "Transport"
    options: dict[str, Any] = {}
    if target is not None and target.is_sentinel:
        options["master_name"] = target.master_name
    return {
        "broker_url": target.library_url if target else None,
        # Poison messages go to dead letters instead of killing the worker: kombu's
        # Redis transport and Celery's consumer, each guarded (tasks.platform.transport,
        # tasks.platform.consumer).
        "broker_transport": f"tasks.platform.transport:{transport}",
        **({"broker_use_ssl": dict(target.ssl)} if target and target.ssl else {}),
        # A hung Redis keeps its sockets open, so every blocking step needs a timeout
        # or it waits forever: connecting, each command (``socket_timeout``, which
        # bounds a publish; the consumer's BRPOP is watched by kombu's health checks
        # instead), and taking a connection from the publisher pool when all are
        # busy. Redis answers in well under a millisecond: half a second means hung.
        "broker_connection_timeout": 2,
        # A message reserved by a worker that then died comes back after the visibility
        # timeout, if kombu kept a copy of it (a recorded job's has none, tasks.platform.transport:
        # the reconciler publishes the job again from its record). Keel keeps it short:
        # a redelivery of a job that is still running is refused by the claim (the
        # record is active and locked), so it costs nothing, and delayed jobs never
        # sit in the broker, so none is redelivered early.
        # kombu sweeps for such messages only every ~100 s by default, and a worker
        # killed mid-sweep holds the sweep mutex for 5 minutes: sweep every 2 s, and
        # let a dead sweeper's mutex lapse after 30 s.
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": 2,
            "unacked_restore_throttle": 1,
            "unacked_mutex_expire": 30,
            "socket_timeout": 0.5,
            "socket_connect_timeout": 0.5,
            # A tenant's load on a queue lowers the priority of its next job
            # (tasks.jobs.intake.tenancy).
            "priority_steps": list(PRIORITY_STEPS),
            **options,
        },
        "task_queues": [
            Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES
        ],
    }


def rabbitmq_broker(settings: Settings) -> dict[str, Any]:
    """Celery's broker settings when ``KEEL_BROKER_URL`` names RabbitMQ.

    Quorum queues (replicated, durable; a RabbitMQ restart keeps every
    message), declared so by every Keel process, including the queues a job
    module adds (``task_create_missing_queue_type``); Celery sees them and
    uses per-consumer prefetch, as quorum queues require. Every publish waits
    for the broker's confirm, bounded (``tasks.platform.rabbitmq``). RabbitMQ itself
    returns a dead worker's unacknowledged messages when its connection drops
    (no visibility timeout); heartbeats every 10 s find a connection that
    went silent. Redis's transport options (priority lists, visibility
    timeout, unacked sweeps) mean nothing here and are not set.
    """
    quorum = {"x-queue-type": "quorum"}
    url = settings.broker_url or ""
    transport = "SSLTransport" if url.lower().startswith("amqps") else "Transport"
    return {
        "broker_url": url,
        "broker_transport": f"tasks.platform.rabbitmq:{transport}",
        # TCP connect, then each step of the AMQP handshake: as long as a confirm may take.
        "broker_connection_timeout": CONFIRM_TIMEOUT_S,
        "broker_heartbeat": 10,
        # A publisher's connection is made on first use: one attempt, not kombu's default
        # of retrying every 2 s until the connect timeout has passed (the worker's own
        # reconnection is Celery's, with its own retry settings).
        "broker_transport_options": {"confirm_publish": True, "max_retries": 0},
        # Topic exchanges (a queue's name as its key): Celery binds them to its native
        # delayed delivery, which serves plain Celery tasks sent with a countdown (Keel
        # keeps its own delays in Postgres); with direct ones it cannot.
        "task_queues": [
            Queue(name, Exchange(name, type="topic"), routing_key=name, queue_arguments=quorum)
            for name in QUEUES
        ],
        "task_default_queue_type": "quorum",
        "task_create_missing_queue_type": "quorum",
        "task_create_missing_queue_exchange_type": "topic",
        "worker_detect_quorum_queues": True,
    }


def broker_options(settings: Settings) -> dict[str, Any]:
    """Celery's settings that depend on which broker carries its messages."""
    return rabbitmq_broker(settings) if settings.broker_on_amqp else redis_broker(settings)


def owned(settings: Settings) -> dict[str, Any]:
    """The settings every Keel app runs with, whatever its own configuration says."""
    options = broker_options(settings)
    return {
        "broker_transport": options["broker_transport"],
        "worker_consumer": "tasks.platform.consumer:Consumer",
        # A job's record, not its message, is what is acknowledged: acks are late, a lost
        # worker's message is rejected back, and a worker takes one message per process.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # AsyncResult reads a Keel job's record (its messages ask Celery to store nothing:
        # the record is the only copy); a plain Celery task's result is Celery's own, in
        # Redis. Chords whose body is a Keel task are counted in the records
        # (tasks.jobs.calls.result_backend).
        **result_backend(settings),
        "task_track_started": False,
        # Flower and the event stream see every job.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_hijack_root_logger": False,
        "beat_scheduler": "tasks.jobs.schedule.beat:KeelScheduler",
    }


def result_backend(settings: Settings) -> dict[str, Any]:
    """Celery's result backend on Keel's Redis: the Sentinel variant for a ``sentinel://``
    URL (with the primary's name), the URL's TLS options for a ``rediss://`` one."""
    target = redis_target(settings)
    backend = "KeelSentinelBackend" if target and target.is_sentinel else "KeelBackend"
    url = target.library_url if target else settings.redis_url
    found: dict[str, Any] = {"result_backend": f"tasks.jobs.calls.result_backend:{backend}+{url}"}
    if target is not None and target.is_sentinel:
        found["result_backend_transport_options"] = {"master_name": target.master_name}
    if target is not None and target.ssl:
        found["redis_backend_use_ssl"] = dict(target.ssl)
    return found


# Settings a Keel app cannot run with, and why: install refuses the app in one line.
REFUSED: dict[str, tuple[Any, str]] = {
    # (the value Keel needs, why)
    "task_serializer": ("json", "job arguments are recorded as JSON in Postgres"),
    "result_serializer": ("json", "results are recorded as JSON in Postgres"),
}


def defaults(settings: Settings) -> dict[str, Any]:
    """Keel's choices where the app has made none (a setting its configuration leaves unset)."""
    options = broker_options(settings)
    return {
        **{key: value for key, value in options.items() if key != "broker_transport"},
        "broker_connection_retry_on_startup": True,
        "broker_pool_acquire_timeout": 1,
        "task_default_queue": "default",
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "worker_concurrency": settings.worker_concurrency,
        "enable_utc": True,
        "timezone": "UTC",
    }


# A worker or beat whose Redis refuses TLS (a wrong CA file) stops at start, in one line
# naming the host and the TLS error, instead of retrying for ever (tasks.platform.broker).
worker_init.connect(broker.refuse_tls_failure, weak=False)
beat_init.connect(broker.refuse_tls_failure, weak=False)
