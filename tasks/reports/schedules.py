"""The reports module's standing scheduler, kept in place whenever beat runs (``standing``)."""

from __future__ import annotations

from tasks.jobs import Backoff, JobOptions
from tasks.jobs.model.schedule_rules import JobTemplate
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope, upsert
from tasks.jobs.schedule.standing import standing
from tasks.platform.builtins import DAILY_CLEANUP_ID
from tasks.reports.jobs import CLEANUP, QUEUE

DAILY_CLEANUP = SchedulerSpec(
    pattern="0 0 3 * * *",
    tz="Asia/Seoul",
    template=JobTemplate(
        name=CLEANUP,
        data={"keepDays": 30},
        opts=JobOptions(
            attempts=3,
            backoff=Backoff(type="exponential", delay=5000),
            remove_on_complete=30,
            remove_on_fail=30,
        ),
    ),
)


@standing(DAILY_CLEANUP_ID)
def ensure_daily_cleanup() -> None:
    """Idempotent: an unchanged scheduler keeps its next fire time (no ``immediately``)."""
    upsert(Scope(), DAILY_CLEANUP_ID, DAILY_CLEANUP, queue=QUEUE)
