"""Bare Celery, the baseline of P1 and P2: ``celery -A bench.bare worker``.

Same Redis broker as Keel, a Redis result backend (so completion is
observable the way a Celery user observes it), late acks, prefetch 1 and
rejection on worker loss — the delivery guarantees Keel's own Celery config
asks for — and Celery's task events on, as Keel ships them for Flower
(``worker_send_task_events``, ``task_send_sent_event``): both sides of P1 and P2
publish the same Celery events. Nothing else: no job records, no queue events.
"""

from __future__ import annotations

import os
import time

from celery import Celery

from bench import pickup

QUEUE = "bench-bare"
NOOP = "bench.bare.noop"
FLAKY = "bench.bare.flaky"
ADD = "bench.bare.add"
STAMP = "bench.bare.stamp"


def _redis_url() -> str:
    url = os.environ.get("KEEL_REDIS_URL")
    if not url:
        raise RuntimeError("KEEL_REDIS_URL is not set (python -m bench sets it for its workers)")
    return url


app = Celery("bench_bare", broker=_redis_url(), backend=_redis_url())
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_send_task_events=True,
    task_send_sent_event=True,
)


class PlannedFailure(Exception):
    """The first run of a flaky task fails on purpose."""


@app.task(name=NOOP)
def noop() -> None:
    """Does nothing: what is left is the system's own cost per task."""
    return None


@app.task(
    bind=True,
    name=FLAKY,
    autoretry_for=(PlannedFailure,),
    max_retries=1,
    retry_kwargs={"countdown": 0},
    retry_backoff=False,
)
def flaky(self) -> None:
    """Fails its first run and succeeds on the retry (Celery's ``autoretry_for``)."""
    if self.request.retries == 0:
        raise PlannedFailure("planned failure on the first run")
    return None


@app.task(name=ADD)
def add(x: int, y: int, ms: int = 0) -> int:
    """P9's task: the sum, after ``ms`` milliseconds of work (its callers wait on ``.get()``)."""
    time.sleep(ms / 1000)
    return x + y


@app.task(name=STAMP)
def stamp(out: str, added: float, due: float) -> None:
    """P11's task: writes when it started (``bench.pickup``), nothing else."""
    pickup.record(out, added, due, time.time())
