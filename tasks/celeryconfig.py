"""Celery settings, loaded with ``app.config_from_object``.

Acks are late and a lost worker's message is rejected back to the queue;
prefetch is one so a busy worker does not sit on other jobs. Results live in
Keel's job records, so Celery's result backend is off. Task events are on so
Flower sees every job.
"""

from __future__ import annotations

from kombu import Exchange, Queue

from tasks.config import get_settings
from tasks.jobs.tenancy import PRIORITY_STEPS

QUEUES = ("reports", "notifications", "default")

_settings = get_settings()

broker_url = _settings.redis_url
# Poison messages go to dead letters instead of killing the worker: kombu's
# Redis transport and Celery's consumer, each guarded (tasks.transport, tasks.consumer).
broker_transport = "tasks.transport:Transport"
worker_consumer = "tasks.consumer:Consumer"
broker_connection_retry_on_startup = True
# A hung Redis keeps its sockets open, so every blocking step needs a timeout
# or it waits forever: connecting, each command (``socket_timeout``, which
# bounds a publish; the consumer's BRPOP is watched by kombu's health checks
# instead), and taking a connection from the publisher pool when all are
# busy. Redis answers in well under a millisecond: half a second means hung.
broker_connection_timeout = 2
broker_pool_acquire_timeout = 1
# A message reserved by a worker that then died comes back after the visibility
# timeout. Keel keeps it short: a redelivery of a job that is still running is
# refused by the claim (the record is active and locked), so it costs nothing,
# and delayed jobs never sit in the broker, so none is redelivered early.
# kombu sweeps for such messages only every ~100 s by default, and a worker
# killed mid-sweep holds the sweep mutex for 5 minutes: sweep every 2 s, and
# let a dead sweeper's mutex lapse after 30 s.
broker_transport_options = {
    "visibility_timeout": _settings.visibility_timeout_s,
    "unacked_restore_interval": 2,
    "unacked_restore_throttle": 1,
    "unacked_mutex_expire": 30,
    "socket_timeout": 0.5,
    "socket_connect_timeout": 0.5,
    # A tenant's load on a queue lowers the priority of its next job (tasks.jobs.tenancy).
    "priority_steps": list(PRIORITY_STEPS),
}
task_queues = [Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES]
task_default_queue = "default"
task_acks_late = True
task_reject_on_worker_lost = True
# No task results are stored (job records hold them); the backend is there so
# Celery chords can count their parts (the campaign fan-in).
# Chords whose body is a Keel task are counted in the records (tasks.jobs.canvas).
result_backend = f"tasks.jobs.canvas:KeelBackend+{_settings.redis_url}"
task_ignore_result = True
task_track_started = False
task_serializer = "json"
accept_content = ["json"]
worker_prefetch_multiplier = 1
worker_concurrency = _settings.worker_concurrency
worker_send_task_events = True
task_send_sent_event = True
worker_hijack_root_logger = False
beat_scheduler = "tasks.jobs.beat:KeelScheduler"
enable_utc = True
timezone = "UTC"
