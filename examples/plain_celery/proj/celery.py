"""The project's Celery app, configured from its own module, then set up for Keel."""

from celery import Celery

import keel

app = Celery("proj")
app.config_from_object("proj.celeryconfig")
keel.install(app)  # its tasks are Keel tasks now; its own settings are kept
