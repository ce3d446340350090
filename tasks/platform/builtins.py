"""Keel's own job apps (the seed's ``reports`` and ``notifications``): what each brings.

Settings validate ``KEEL_BUILTIN_JOBS`` against these names (``tasks.platform.config``);
``tasks.platform.catalog`` turns the ones that are on into the modules a process loads.
"""

from __future__ import annotations

from dataclasses import dataclass

DAILY_CLEANUP_ID = "daily-report-cleanup"
CAMPAIGN_MONITOR_ID = "campaign-monitor"
DEFAULT_QUEUE = "default"
# The job layer's own queue: webhook deliveries (tasks.jobs.upkeep.webhook_delivery), on
# whatever apps are on.
WEBHOOKS_QUEUE = "webhooks"


@dataclass(frozen=True)
class BuiltinApp:
    """What one of Keel's own job apps brings into a process when it is on."""

    modules: tuple[str, ...]
    queue: str
    schedulers: tuple[str, ...]  # system schedulers its modules upsert when beat starts


BUILTIN_APPS: dict[str, BuiltinApp] = {
    "reports": BuiltinApp(
        modules=("tasks.reports.jobs", "tasks.reports.schedules"),
        queue="reports",
        schedulers=(DAILY_CLEANUP_ID,),
    ),
    "notifications": BuiltinApp(
        modules=("tasks.notifications.jobs", "tasks.notifications.schedules"),
        queue="notifications",
        schedulers=(CAMPAIGN_MONITOR_ID,),
    ),
}


def parse_builtin(text: str) -> tuple[str, ...]:
    """``KEEL_BUILTIN_JOBS``'s names, in ``BUILTIN_APPS`` order; an unknown name is an error."""
    names = {name for name in text.replace(",", " ").split() if name}
    if names == {"none"}:
        return ()
    unknown = sorted(names - set(BUILTIN_APPS))
    if unknown:
        raise ValueError(
            f"unknown built-in job app {', '.join(unknown)}: choose from "
            f"{', '.join(BUILTIN_APPS)}, or none"
        )
    return tuple(name for name in BUILTIN_APPS if name in names)
