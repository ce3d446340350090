"""``KeelScheduler``: Celery beat's scheduler class for Keel's job schedulers.

``celery -A tasks beat -S tasks.jobs.schedule.beat:KeelScheduler`` (the default in
Keel's config). Each tick fires the schedulers that are due and sleeps until
the next one, at most ``max_interval`` so changes made through the API reach
a running beat within a second. Several beats may run at once: row locks
with SKIP LOCKED and derived job ids keep it at one job per scheduled time.
A tenant's scheduler fires under the tenant's quotas (``tasks.platform.quotas``).

The app's ``beat_schedule`` entries become system schedulers when beat
starts (``tasks.jobs.schedule.beat_entries``), so they too fire once per scheduled
time however many beats run; if the database is away at start, each tick
tries again until it is done.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import redis
from celery.beat import Scheduler

from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs.model.errors import JobNotFound
from tasks.jobs.observe import quiet
from tasks.jobs.schedule import beat_entries, firing, schedulers, standing
from tasks.jobs.upkeep import liveness
from tasks.platform import quotas
from tasks.platform.catalog import disabled_apps
from tasks.platform.db import passing

log = logging.getLogger(__name__)
# How soon beat looks again at a slot held by ``overlap: buffer`` (it is due, so the next
# fire time alone would have beat ask at once, again and again, while the last job runs).
HELD_POLL_S = 0.25


class KeelScheduler(Scheduler):
    """Fires Postgres-stored job schedulers, ``beat_schedule`` entries among them."""

    max_interval = 1.0
    _last_heartbeat = 0.0
    _alive: redis.Redis | None = None
    _redis_ok_at: float | None = None
    _synced = False
    _setup: dict[str, Callable[[], None]] = {}

    def setup_schedule(self) -> None:
        quotas.current()  # a malformed KEEL_TENANT_QUOTAS stops beat at start, loudly
        load_job_modules()  # every job type (KEEL_JOB_MODULES too) declared before any fire
        # Set up once, each tried again at every tick until it has worked: the database
        # may be away at start, or a migration or another beat in the way for a moment.
        self._setup: dict[str, Callable[[], None]] = {
            "retiring disabled apps' schedulers": retire_disabled_apps,
            **{f"standing scheduler {i}": ensure for i, ensure in standing.declared().items()},
        }
        self._set_up()
        self._sync_entries()

    def _set_up(self) -> None:
        for what, step in list(self._setup.items()):
            try:
                step()
            except Exception as exc:
                log.warning("%s not done yet; retrying", what, exc_info=True)
                if passing(exc):  # the database away: the others would fail the same way
                    return
                continue
            del self._setup[what]

    def _sync_entries(self) -> None:
        try:
            beat_entries.sync(self.app)
        except Exception:  # the database may be away at start: the next tick tries again
            log.warning("beat_schedule entries not stored yet; retrying", exc_info=True)
            return
        self._synced = True

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self._heartbeat()
        if self._setup:
            self._set_up()
        if not self._synced:
            self._sync_entries()
        try:
            fired = firing.fire_due(job_limits=quotas.current().jobs)
            for job_id in fired.job_ids:
                name = fired.names.get(job_id, "")
                log.log(quiet.level_for(name), "scheduler fired job %s (%s)", job_id, name)
            if fired.unsent:  # the broker is away: try those fires again in a while
                return self.max_interval
            if fired.held:  # due slots waiting for their scheduler's last job: look again soon
                return HELD_POLL_S
            return firing.seconds_until_next(self.max_interval)
        except Exception:  # the database may be briefly away; try again shortly
            log.warning("firing job schedulers failed; retrying", exc_info=True)
            return self.max_interval

    def _heartbeat(self) -> None:
        """Say this beat is alive (``python -m tasks.jobs.upkeep.healthcheck beat``)."""
        if time.monotonic() - self._last_heartbeat < liveness.HEARTBEAT_S:
            return
        self._last_heartbeat = time.monotonic()
        member = f"beat@{socket.gethostname()}"
        try:
            self._alive = self._alive or liveness.quick_client()
            liveness.beat(self._alive, "beat", member)
            self._redis_ok_at = time.time()
        except redis.RedisError as exc:
            log.warning("beat heartbeat not recorded: %s", exc)
        liveness.beat_locally("beat", member, self._redis_ok_at)

    def sync(self) -> None:
        """Nothing to flush: every fire is committed as it happens."""

    @property
    def info(self) -> str:
        return "    . job schedulers: postgres (keel), beat_schedule entries as beat:<name>"


def retire_disabled_apps() -> None:
    """A built-in app turned off (``KEEL_BUILTIN_JOBS``) loses the schedulers it stored.

    Its job types are gone from every process, so a scheduler an earlier run
    upserted would fire jobs no worker knows. Only its own standing ids go.
    """
    for builtin in disabled_apps():
        for scheduler_id in builtin.schedulers:
            try:
                schedulers.remove(schedulers.Scope(), scheduler_id)
            except JobNotFound:
                continue
            log.info(
                "removed system scheduler %s: its app is off (KEEL_BUILTIN_JOBS)", scheduler_id
            )
