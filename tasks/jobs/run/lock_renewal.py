"""Lock renewal for the jobs this process is running (what keeps a long run from stalling).

A claimed job holds a lock for ``KEEL_LOCK_DURATION_S``; while its handler
runs, one daemon thread per process pushes every held lock further out
every third of that time, and every second after a renewal failed (the
database away) until one works. A worker that dies stops renewing, its locks
run out, and the job becomes claimable again (stalled). So does a run whose
lock ran out while the database was away longer than the lock: its record no
longer says anyone holds it, as a BullMQ job's lock lapses while Redis is down.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from tasks.jobs.store import runs
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

log = logging.getLogger(__name__)

_tokens: dict[str, float | None] = {}  # token → renewed until then (``time.monotonic()``)
_guard = threading.Lock()
_thread: dict[int, threading.Thread] = {}


def track(token: str, until: float | None = None) -> None:
    """Renew ``token``'s lock while its run goes on, but not past ``until`` (its hard time
    limit, where the pool cannot kill the run: the lock then runs out, and the job is
    stalled and run again by another worker; the late end of this run is refused)."""
    with _guard:
        _tokens[token] = until
        if os.getpid() not in _thread:
            thread = threading.Thread(target=_renew_forever, name="keel-heartbeat", daemon=True)
            _thread[os.getpid()] = thread
            thread.start()


def untrack(token: str) -> None:
    with _guard:
        _tokens.pop(token, None)


def renewed(now: float) -> list[str]:
    """The tokens whose locks are pushed out at ``now``: every tracked run's, but those past
    their ``until``."""
    with _guard:
        return [token for token, until in _tokens.items() if until is None or until > now]


RETRY_S = 1.0  # after a failed renewal: the next try, well inside what is left of the lock


def _renew_forever() -> None:
    lock_s = get_settings().lock_duration_s
    stop = threading.Event()
    wait_s = lock_s / 3
    while not stop.wait(wait_s):
        wait_s = lock_s / 3
        tokens = renewed(time.monotonic())
        if not tokens:
            continue
        try:
            with transaction() as session:
                runs.extend_locks(session, tokens, lock_s)
        except Exception:
            # The database is away (or hung): try again in a second, not a third of the
            # lock later, so that a run whose lock has not run out yet when it is back is
            # renewed before another worker's stall check finds it lapsed.
            log.warning("could not renew job locks; retrying in %.0f s", RETRY_S, exc_info=True)
            wait_s = min(RETRY_S, lock_s / 3)
