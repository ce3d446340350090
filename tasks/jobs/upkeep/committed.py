"""Jobs a caller's transaction committed, published the moment Postgres says it did.

A job added in a caller's transaction on a connection that cannot tell its own process it
committed (SQLAlchemy Core, plain psycopg: ``tasks.jobs.intake.caller_transaction``) is
recorded parked, due in ``BACKSTOP_S``, and its transaction sends ``NOTIFY
keel_committed, '<job ids>'`` (comma-separated), which Postgres delivers when, and only
if, it commits. Every worker listens here, on a connection of its own, and publishes those
jobs at once (``publish_now``: a job another worker or the promoter took already is
skipped). A
notification nobody heard (no worker running, a connection lost, a pooler that cannot
``LISTEN``) costs only the backstop's wait: the promoter publishes the job when it is due.

A ``LISTEN`` needs a session of its own, which a transaction pooler does not keep: the
listener connects to ``KEEL_DATABASE_DIRECT_URL`` (Postgres past the pooler) when it is set;
else, with ``KEEL_DATABASE_POOLER=transaction``, it does not listen, and says so once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
from celery import bootsteps

from tasks.jobs.intake.caller_transaction import BACKSTOP_S, publish_now
from tasks.jobs.store.upkeep import COMMITTED_CHANNEL
from tasks.platform.config import get_settings, sqlalchemy_url

log = logging.getLogger(__name__)
WAIT_S = 1.0  # how long one wait for notifications lasts (the stop is checked between)
RETRY_S = 5.0  # after a lost connection


def conninfo() -> str | None:
    """Keel's database, as libpq takes it (the listener's own connection); None: none that
    keeps a session (a transaction pooler's, and no direct URL)."""
    settings = get_settings()
    if settings.database_direct_url:
        url = sqlalchemy_url(settings.database_direct_url)
    elif settings.database_pooler == "transaction":
        return None
    else:
        url = settings.sqlalchemy_url
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


class CommitListener(bootsteps.StartStopStep):
    """Listens for committed callers' jobs beside the worker's pool, and publishes them."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._url: str | None = None

    def start(self, worker: Any) -> None:
        self._url = conninfo()
        if self._url is None:
            log.info(
                "not listening for committed jobs: KEEL_DATABASE_POOLER=transaction and no "
                "KEEL_DATABASE_DIRECT_URL; jobs added in a caller's transaction are published "
                "within %.0f s of its commit",
                BACKSTOP_S,
            )
            return
        self._thread = threading.Thread(target=self._loop, name="keel-committed", daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_S + 5)

    def terminate(self, worker: Any) -> None:
        """A cold shutdown stops the thread too (bootsteps call ``terminate``, not ``stop``):
        else it outlives its worker, listening on (and logging about) a database that may
        be gone."""
        self.stop(worker)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception:  # the backstop publishes what this misses
                log.warning(
                    "listening for committed jobs failed; again in %.0f s", RETRY_S, exc_info=True
                )
                self._stop.wait(RETRY_S)

    def _listen(self) -> None:
        with psycopg.connect(self._url or "", autocommit=True, connect_timeout=5) as connection:
            connection.execute(f"LISTEN {COMMITTED_CHANNEL}")
            while not self._stop.is_set():
                for note in connection.notifies(timeout=WAIT_S):  # each as it arrives
                    publish_now(note.payload.split(","))
