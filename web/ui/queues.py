"""Queues of the operator's tenant: jobs per state, the last hour's throughput, the limits,
and a pause of the tenant's jobs on each (``tasks.jobs.intake.pauses``), with its button.

A queue's limits are every tenant's (``tasks.jobs.run.live_limits``): shown with where they
come from — set live (when; who is the system's to know, as a pause of the whole queue) or
``KEEL_QUEUE_LIMITS`` — and changed only in the system scope (the API with the metrics token,
``keel queues limits``, the platform role's form), never from a tenant's page.

Counts come from the trigger-maintained per-tenant counters
(``store.counts.by_queue``); the charts — completed, failed, wait and run time over the last
hour, day or week (``?range=``) — from the queue history, counted as jobs end and kept
apart from the records (``tasks.jobs.observe.queue_history``), so retention does not
shorten them. Workers and individual task runs are Flower's view: the page links to it.

A platform session (``web.ui.platform``) sees every queue's jobs counted across every tenant
(``queue_counts.by_queue_of_every_tenant``), the pauses of every tenant and the limits, with
a form setting and clearing each queue's limits (``web.ui.limit_forms``): no chart (the
history is counted per tenant), no Pause or Resume.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flask import g, render_template, request, url_for

from tasks.celeryconfig import QUEUES
from tasks.jobs.intake import pauses
from tasks.jobs.model import registry
from tasks.jobs.model.models import STATES
from tasks.jobs.observe.queue_counts import by_queue, by_queue_of_every_tenant
from tasks.jobs.observe.queue_history import SPANS, Bucket, History, history
from tasks.jobs.run import live_limits
from web.auth import OPERATOR
from web.errors import ApiError
from web.ui import bp
from web.ui.forms import act
from web.ui.session import signed_in

CHART_HEIGHT = 60
BAR_STEP = 10  # a bucket's width in the chart's own units (its bar is 8 of them)
SPAN_LABELS = {"hour": "the last hour", "day": "the last day", "week": "the last week"}
BUCKET_LABELS = {"hour": "5 minutes", "day": "30 minutes", "week": "6 hours"}
AXIS_FROM = {"hour": "60 min ago", "day": "24 h ago", "week": "7 days ago"}
# Each chart: what it shows, and the bucket's value it draws.
CHARTS: tuple[tuple[str, str, Callable[[Bucket], float]], ...] = (
    ("completed", "Throughput (completed)", lambda b: b.completed),
    ("failed", "Failures", lambda b: b.failed),
    ("wait", "Wait time (average)", lambda b: b.wait_avg_s or 0.0),
    ("run", "Run time (average)", lambda b: b.run_avg_s or 0.0),
)


def _seconds(value: float | None) -> str:
    if value is None:
        return "none"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _bar_title(kind: str, bucket: Bucket, step_s: int) -> str:
    when = f"{bucket.start:%Y-%m-%d %H:%M} to {bucket.start + timedelta(seconds=step_s):%H:%M} UTC"
    if kind in ("completed", "failed"):
        return f"{when}: {getattr(bucket, kind)} {kind}"
    avg, peak = getattr(bucket, f"{kind}_avg_s"), getattr(bucket, f"{kind}_max_s")
    if avg is None:
        return f"{when}: no runs"
    return f"{when}: {kind} average {_seconds(avg)}, max {_seconds(peak)} ({bucket.timed} runs)"


def _summary(kind: str, series: list[Bucket], span: str) -> str:
    if kind in ("completed", "failed"):
        return f"{sum(getattr(b, kind) for b in series)} {kind} in {SPAN_LABELS[span]}"
    timed = sum(b.timed for b in series)
    if not timed:
        return f"{kind} time: no runs in {SPAN_LABELS[span]}"
    avg = sum((getattr(b, f"{kind}_avg_s") or 0.0) * b.timed for b in series) / timed
    peak = max(getattr(b, f"{kind}_max_s") or 0.0 for b in series)
    spread = f"average {_seconds(avg)}, max {_seconds(peak)}"
    return f"{kind} time: {spread} over {timed} runs in {SPAN_LABELS[span]}"


def _charts(series: list[Bucket], found: History, peaks: dict[str, float]) -> list[dict[str, Any]]:
    """A queue's four charts: bars scaled to the page's busiest bucket of each kind."""
    charts = []
    for kind, label, value in CHARTS:
        peak = peaks[kind]
        bars = [
            {
                "x": i * BAR_STEP,
                "height": round(CHART_HEIGHT * value(b) / peak) if peak else 0,
                "title": _bar_title(kind, b, found.step_s),
            }
            for i, b in enumerate(series)
        ]
        total = sum(getattr(b, kind) for b in series) if kind in ("completed", "failed") else None
        summary = _summary(kind, series, found.span)
        charts.append(
            {"kind": kind, "label": label, "bars": bars, "total": total, "summary": summary}
        )
    return charts


@bp.get("/queues")
@signed_in(OPERATOR, reach="reads")
def queues_page() -> Any:
    if g.principal.platform:
        return platform_queues()
    tenant = g.principal.tenant_id
    span = request.args.get("range", "hour")
    if span not in SPANS:
        span = "hour"
    counts = by_queue(tenant)
    found = history(tenant, span)
    paused: dict[str, str] = {}  # queue -> "all" (every tenant's) or "tenant" (this tenant's)
    mine: set[str] = set()  # the queues this tenant paused (it may resume them)
    for pause in pauses.paused(tenant):
        if pause.tenant_id:
            mine.add(pause.queue)
        if paused.get(pause.queue) != "all":
            paused[pause.queue] = "tenant" if pause.tenant_id else "all"
    limits = {shown.queue: shown for shown in live_limits.shown()}
    names = sorted(set(QUEUES) | set(registry.queues()) | set(counts) | mine | set(found.queues))
    count = SPANS[span].count
    empty = [Bucket(found.since + i * timedelta(seconds=found.step_s)) for i in range(count)]
    every = [b for series in found.queues.values() for b in series]
    peaks = {kind: max([value(b) for b in every] or [0]) for kind, _, value in CHARTS}
    rows = []
    for queue in names:
        series = found.queues.get(queue, empty)
        done = sum(b.completed for b in series)
        failed = sum(b.failed for b in series)
        rows.append(
            {
                "name": queue,
                "counts": counts.get(queue, dict.fromkeys(STATES, 0)),
                "completed": done,
                "failed": failed,
                "failure_rate": (failed / (done + failed)) if done + failed else None,
                "charts": _charts(series, found, peaks),
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
        span=span,
        spans=SPAN_LABELS,
        span_label=SPAN_LABELS[span],
        axis_from=AXIS_FROM[span],
        bucket=BUCKET_LABELS[span],
        chart_height=CHART_HEIGHT,
        chart_width=count * BAR_STEP,
    )


def platform_queues(status: int = 200, also: str = "", **more: Any) -> Any:
    """The platform role's queues page: counts across every tenant, pauses, limits and their
    forms (``more``: a refused form's values and errors, ``web.ui.limit_forms``; ``also``:
    its queue, shown even if no job type, job or limit names it now)."""
    counts = by_queue_of_every_tenant()
    paused: dict[str, str] = {}  # queue -> "all", or how many tenants paused their jobs
    for pause in pauses.paused():
        if not pause.tenant_id:
            paused[pause.queue] = "all"
        elif paused.get(pause.queue) != "all":
            paused[pause.queue] = str(int(paused.get(pause.queue, "0")) + 1)
    limits = {shown.queue: shown for shown in live_limits.shown()}
    names = sorted(
        set(QUEUES) | set(registry.queues()) | set(counts) | set(paused) | set(limits) | {also}
    )
    rows = [
        {
            "name": queue,
            "counts": counts.get(queue, dict.fromkeys(STATES, 0)),
            "limit": limits.get(queue),
            "paused": paused.get(queue),
        }
        for queue in names
        if queue
    ]
    page = render_template("ui/platform_queues.html", queues=rows, states=STATES, **more)
    return page, status


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
