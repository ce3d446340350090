"""Queues of the operator's tenant: jobs per state, the last hour's throughput, the limits.

Counts come from the trigger-maintained per-tenant counters
(``store.counts.by_queue``); throughput and failures from the finished job
records of the last hour (what retention keeps of them). Workers and
individual task runs are Flower's view: the page links to it.
"""

from __future__ import annotations

from typing import Any

from flask import g, render_template

from tasks.celeryconfig import QUEUES
from tasks.jobs.model import registry
from tasks.jobs.model.models import STATES
from tasks.jobs.observe.queries import activity
from tasks.jobs.run.limits import configured
from tasks.jobs.store.counts import by_queue
from web.auth import OPERATOR
from web.ui import bp
from web.ui.session import signed_in

CHART_HEIGHT = 60


def _bars(series: list[int], peak: int) -> list[dict[str, int]]:
    """Bar heights of a small SVG chart, scaled to the busiest bucket of the page."""
    return [
        {"n": n, "height": round(CHART_HEIGHT * n / peak) if peak else 0, "x": i * 12}
        for i, n in enumerate(series)
    ]


@bp.get("/queues")
@signed_in(OPERATOR)
def queues_page() -> Any:
    tenant = g.principal.tenant_id
    counts = by_queue(tenant)
    recent = activity(tenant)
    names = sorted(set(QUEUES) | set(registry.queues()) | set(counts))
    peak = max([n for s in (*recent.completed.values(), *recent.failed.values()) for n in s] or [0])
    rows = []
    for queue in names:
        done = recent.completed.get(queue, [])
        failed = recent.failed.get(queue, [])
        finished = sum(done) + sum(failed)
        rows.append(
            {
                "name": queue,
                "counts": counts.get(queue, dict.fromkeys(STATES, 0)),
                "completed": sum(done),
                "failed": sum(failed),
                "failure_rate": (sum(failed) / finished) if finished else None,
                "done_bars": _bars(done, peak),
                "failed_bars": _bars(failed, peak),
                "limit": configured().get(queue),
            }
        )
    return render_template(
        "ui/queues.html",
        queues=rows,
        states=STATES,
        bucket_minutes=recent.bucket_s // 60,
        chart_height=CHART_HEIGHT,
    )
