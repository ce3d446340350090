"""The project's own Celery settings: Keel keeps them (the broker is Keel's Redis)."""

from kombu import Queue

include = ["proj.tasks"]
task_serializer = "json"
accept_content = ["json"]
task_queues = [Queue("celery"), Queue("images")]
task_default_queue = "celery"
task_routes = {"proj.tasks.resize": {"queue": "images"}}
beat_schedule = {
    "tick-every-minute": {"task": "proj.tasks.tick", "schedule": 60.0},
}
