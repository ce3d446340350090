"""Which runs' locks are renewed: every tracked run's, but not past its ``until`` (a hard
time limit no pool process kill enforces: the threads and solo pools)."""

from __future__ import annotations

import time
import uuid

from tasks.jobs.run import lock_renewal


def test_a_run_s_lock_is_renewed_until_its_limit_and_not_after():
    unlimited, limited = uuid.uuid4().hex, uuid.uuid4().hex
    now = time.monotonic()
    lock_renewal.track(unlimited)
    lock_renewal.track(limited, until=now + 1)
    try:
        assert {unlimited, limited} <= set(lock_renewal.renewed(now))
        later = set(lock_renewal.renewed(now + 1.5))
        assert unlimited in later and limited not in later
    finally:
        lock_renewal.untrack(unlimited)
        lock_renewal.untrack(limited)
    assert not {unlimited, limited} & set(lock_renewal.renewed(now))
