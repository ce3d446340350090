"""A job whose message goes out before its record commits, as a canvas child's does."""

from __future__ import annotations

import time
from typing import Any

from tasks.jobs import JobOptions
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.store import jobs as store
from tasks.jobs.store.jobs import NewJob
from tasks.platform.db import transaction
from tests.support.client import unique


def published_before_commit(name: str, queue: str, data: dict[str, Any], hold_s: float) -> str:
    """Record a system job and publish its message inside one transaction, kept open
    ``hold_s`` seconds after the publish (a chain's next step is recorded and published
    inside its parent's completing transaction: ``tasks.jobs.end.canvas``); its id."""
    job = NewJob(
        id=unique("early"),
        name=name,
        queue=queue,
        data=data,
        tenant_id=None,
        user_id=None,
        opts=JobOptions(),
        priority=0,
    )
    with transaction() as session:
        assert store.insert(session, job)
        publish_ready(session, [store.ready_job(job)])
        time.sleep(hold_s)  # a worker has the message meanwhile, and no record to see
    return job.id
