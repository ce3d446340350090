"""Keel's Celery app with a ``beat_schedule``, as a user's project would configure it.

``celery -A tests.support.beat_app beat``: the beat tests run real beats of
this app (``tests/integration/test_beat_schedule.py``).
"""

from __future__ import annotations

from celery.schedules import crontab

import tests.support.jobs  # noqa: F401  (the tasks the entries name, as a user's app imports them)
from tasks.celery import app

app.conf.beat_schedule = {
    # A Keel job type: a job record per fire
    "echo-every-second": {
        "task": "test.echo",
        "schedule": 1.0,
        "kwargs": {"from": "beat_schedule"},
    },
    # A plain Celery task: a message per fire
    "tick-every-second": {"task": "test.beat_tick", "schedule": 1.0},
    "nightly-echo": {"task": "test.echo", "schedule": crontab(minute=30, hour=4)},
    # Cannot be converted: test.echo runs on "default"
    "echo-on-reports": {"task": "test.echo", "schedule": 5.0, "options": {"queue": "reports"}},
}
