"""The project's Celery app, as Celery's Django guide writes it, plus ``keel.install``."""

import os

from celery import Celery

import keel

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
keel.install(app)
app.autodiscover_tasks()
