"""examples/plain_celery's app, its beat_schedule firing every second (the beat test's).

The project's own app is unchanged: this module only shortens its schedule, as a project's
settings for a test would.
"""

from proj.celery import app

app.conf.beat_schedule = {"tick-every-second": {"task": "proj.tasks.tick", "schedule": 1.0}}
