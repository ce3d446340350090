"""A job as a tenant sees it, in the API and the dashboard: ``tasks.jobs.observe.queries``'s
view of the record, less what names the system's hosts and processes.

Each run of a job's timeline records the worker (``name@host``) and the pid that ran it;
the record keeps them (``keel jobs show``, the stalled and abort checks), but a tenant is
shown its runs without them: host names are the system's, not any tenant's to know
(docs/tenants.md).
"""

from __future__ import annotations

from typing import Any

from tasks.jobs.model.models import JobRecord
from tasks.jobs.observe import queries

SYSTEM_RUN_FIELDS = frozenset({"worker", "pid"})


def without_hosts(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with its runs' worker and pid left out."""
    runs = view.get("runs")
    if not runs:
        return view
    shown = [
        {k: v for k, v in run.items() if k not in SYSTEM_RUN_FIELDS}
        if isinstance(run, dict)
        else run
        for run in runs
    ]
    return {**view, "runs": shown}


def describe(job: JobRecord) -> dict[str, Any]:
    """The job's status, as every endpoint and page shows it to its tenant."""
    return without_hosts(queries.describe(job))


def describe_full(job: JobRecord) -> dict[str, Any]:
    """``describe`` plus what the job was added with: its data, options and user."""
    return without_hosts(queries.describe_full(job))
