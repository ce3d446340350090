"""``/api/v1/queues``: the tenant's jobs per state on every queue it uses (operators).

Every job type's queue is covered — Keel's and those of your own job modules —
from the same trigger-fed counters as the reports queue's health.
"""

from __future__ import annotations

from flask import Blueprint, g

from tasks.jobs.store.counts import by_queue
from web.api import operation
from web.schemas import Open

bp = Blueprint("queues", __name__, url_prefix="/api/v1/queues")


class QueueCounts(Open):
    queues: dict[str, dict[str, int]]


@operation(
    bp,
    "",
    "GET",
    summary="The tenant's jobs per state on each queue it uses",
    role="operator",
    responses={200: QueueCounts},
)
def queue_counts():
    return {"queues": by_queue(g.principal.tenant_id)}
