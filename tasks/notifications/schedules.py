"""The campaign monitor's scheduler, kept in place whenever beat runs (``standing``)."""

from __future__ import annotations

from tasks.jobs import JobOptions
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope, upsert
from tasks.jobs.schedule.standing import standing
from tasks.notifications.jobs import MONITOR, QUEUE
from tasks.platform.builtins import CAMPAIGN_MONITOR_ID as MONITOR_ID

MONITOR_EVERY_MS = 10_000


@standing(MONITOR_ID)
def ensure_monitor() -> None:
    spec = SchedulerSpec(
        every=MONITOR_EVERY_MS,
        template=JobTemplate(
            name=MONITOR, opts=JobOptions(remove_on_complete=10, remove_on_fail=50)
        ),
    )
    upsert(Scope(), MONITOR_ID, spec, queue=QUEUE)
