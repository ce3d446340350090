"""Queues of the operator's tenant: jobs per state, the last hour's throughput, the limits,
and a pause of the tenant's jobs on each (``tasks.jobs.intake.pauses``), with its button.

A queue's limits are every tenant's (``tasks.jobs.run.live_limits``): shown with where they
come from — set live (when; who is the system's to know, as a pause of the whole queue) or
``KEEL_QUEUE_LIMITS`` — and changed only in the system scope (the API with the metrics token,
``keel queues limits``), never from this page.

Counts come from the trigger-maintained per-tenant counters
(``store.counts.by_queue``); throughput and failures from the finished job
records of the last hour (what retention keeps of them). Workers and
individual task runs are Flower's view: the page links to it.
"""

from __future__ import annotations

from typing import Any

from flask import g, render_template, url_for

from tasks.celeryconfig import QUEUES
from tasks.jobs.intake import pauses
from tasks.jobs.model import registry
from tasks.jobs.model.models import STATES
from tasks.jobs.observe.queries import activity
from tasks.jobs.observe.queue_counts import by_queue
from tasks.jobs.run import live_limits
from web.auth import OPERATOR
from web.errors import ApiError
from web.ui import bp
from web.ui.forms import act
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
    paused: dict[str, str] = {}  # queue -> "all" (every tenant's) or "tenant" (this tenant's)
    mine: set[str] = set()  # the queues this tenant paused (it may resume them)
    for pause in pauses.paused(tenant):
        if pause.tenant_id:
            mine.add(pause.queue)
        if paused.get(pause.queue) != "all":
            paused[pause.queue] = "tenant" if pause.tenant_id else "all"
    limits = {found.queue: found for found in live_limits.shown()}
    names = sorted(set(QUEUES) | set(registry.queues()) | set(counts) | mine)
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
                "limit": limits.get(queue),
                "paused": paused.get(queue),
                "paused_by_tenant": queue in mine,
                "pausable": queue in registry.queues() or queue in mine,
            }
        )
    return render_template(
        "ui/queues.html",
        queues=rows,
        states=STATES,
        bucket_minutes=recent.bucket_s // 60,
        chart_height=CHART_HEIGHT,
    )


def _pausable(queue: str) -> str:
    """A queue some job type runs on; else the 404 the API answers (not a refusal shown)."""
    if queue not in registry.queues():
        raise ApiError(404, f"no job type runs on queue {queue!r}", code="queue_not_found")
    return queue


@bp.post("/queues/<queue>/pause")
@signed_in(OPERATOR)
def pause_queue(queue: str) -> Any:
    principal, queue = g.principal, _pausable(queue)
    return act(
        url_for("ui.queues_page"),
        lambda: pauses.pause(queue, principal.tenant_id, by=principal.user_id),
        f"Paused: your jobs on {queue} wait until you resume it.",
    )


@bp.post("/queues/<queue>/resume")
@signed_in(OPERATOR)
def resume_queue(queue: str) -> Any:
    principal = g.principal
    if not any(p.queue == queue and p.tenant_id for p in pauses.paused(principal.tenant_id)):
        _pausable(queue)  # nothing of this tenant's to lift: an unknown queue is a 404
    return act(
        url_for("ui.queues_page"),
        lambda: pauses.resume(queue, principal.tenant_id, by=principal.user_id),
        f"Resumed: your jobs on {queue} run again.",
    )
