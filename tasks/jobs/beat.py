"""``KeelScheduler``: Celery beat's scheduler class for Keel's job schedulers.

``celery -A tasks beat -S tasks.jobs.beat:KeelScheduler`` (the default in
Keel's config). Each tick fires the schedulers that are due and sleeps until
the next one, at most ``max_interval`` so changes made through the API reach
a running beat within a second. Several beats may run at once: row locks
with SKIP LOCKED and derived job ids keep it at one job per scheduled time.
A tenant's scheduler fires under the tenant's quotas (``tasks.quotas``).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import redis
from celery.beat import Scheduler

from tasks import quotas
from tasks.jobs import liveness, schedulers

log = logging.getLogger(__name__)


class KeelScheduler(Scheduler):
    """Fires Postgres-stored job schedulers instead of ``beat_schedule`` entries."""

    max_interval = 1.0
    _last_heartbeat = 0.0
    _alive: redis.Redis | None = None

    def setup_schedule(self) -> None:
        quotas.current()  # a malformed KEEL_TENANT_QUOTAS stops beat at start, loudly
        if self.app.conf.beat_schedule:
            log.warning("beat_schedule entries are ignored: use job schedulers (keel schedulers)")

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self._heartbeat()
        try:
            for job_id in schedulers.fire_due(job_limits=quotas.current().jobs):
                log.info("scheduler fired job %s", job_id)
            return schedulers.seconds_until_next(self.max_interval)
        except Exception:  # the database may be briefly away; try again shortly
            log.warning("firing job schedulers failed; retrying", exc_info=True)
            return self.max_interval

    def _heartbeat(self) -> None:
        """Say this beat is alive (``python -m tasks.jobs.healthcheck beat``)."""
        if time.monotonic() - self._last_heartbeat < liveness.HEARTBEAT_S:
            return
        self._last_heartbeat = time.monotonic()
        try:
            self._alive = self._alive or liveness.quick_client()
            liveness.beat(self._alive, "beat", f"beat@{socket.gethostname()}")
        except redis.RedisError as exc:
            log.warning("beat heartbeat not recorded: %s", exc)

    def sync(self) -> None:
        """Nothing to flush: every fire is committed as it happens."""

    @property
    def info(self) -> str:
        return "    . job schedulers: postgres (keel)"
