"""The Celery application: ``celery -A tasks worker|beat|flower``."""

from __future__ import annotations

from celery import Celery

from tasks.catalog import JOB_MODULES
from tasks.jobs.liveness import Heartbeat
from tasks.jobs.maintenance import Maintenance

app = Celery("keel", include=JOB_MODULES, events="tasks.celery_events:KeelEvents")
app.config_from_object("tasks.celeryconfig")
app.steps["worker"].add(Maintenance)
app.steps["consumer"].add(Heartbeat)
