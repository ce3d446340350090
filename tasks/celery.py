"""The Celery application: ``celery -A tasks worker|beat|flower``."""

from __future__ import annotations

from celery import Celery

from tasks.catalog import JOB_MODULES

app = Celery("keel", include=JOB_MODULES, events="tasks.celery_events:KeelEvents")
app.config_from_object("tasks.celeryconfig")
# Named, not imported: Celery loads its bootsteps by name, and the job layer they
# come from imports this app (to publish) — nothing here imports it back.
app.steps["worker"].add("tasks.jobs.maintenance:Maintenance")
app.steps["consumer"].add("tasks.jobs.liveness:Heartbeat")
