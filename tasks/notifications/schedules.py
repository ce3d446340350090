"""The campaign monitor's scheduler, upserted whenever beat starts."""

from __future__ import annotations

import logging

from celery.signals import beat_init

from tasks.catalog import CAMPAIGN_MONITOR_ID as MONITOR_ID
from tasks.jobs import JobOptions
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope, upsert
from tasks.notifications.jobs import MONITOR, QUEUE

log = logging.getLogger(__name__)
MONITOR_EVERY_MS = 10_000


def ensure_monitor() -> None:
    spec = SchedulerSpec(
        every=MONITOR_EVERY_MS,
        template=JobTemplate(
            name=MONITOR, opts=JobOptions(remove_on_complete=10, remove_on_fail=50)
        ),
    )
    upsert(Scope(), MONITOR_ID, spec, queue=QUEUE)


@beat_init.connect
def _on_beat_start(**kwargs) -> None:
    try:
        ensure_monitor()
    except Exception:
        log.exception("could not upsert %s; beat goes on", MONITOR_ID)
