"""The multihost tier: Keel's parts on separate hosts (network namespaces), cut apart mid-run.

It needs root and ``ip netns``; elsewhere its tests skip, saying why. One
stack serves every test of the tier (it takes a few seconds to build and
would otherwise be built per test).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.multihost import KeelHosts
from tests.support.netns import unavailable_reason

# Short locks and sweeps so that a cut-off worker's jobs move within seconds, not minutes.
LOCK_S = 10
SETTINGS = {
    "KEEL_REPORT_STEP_PAUSE_MS": "100",
    "KEEL_LOCK_DURATION_S": str(LOCK_S),
    "KEEL_STALLED_INTERVAL_S": "1",
    "KEEL_VISIBILITY_TIMEOUT_S": "15",
    # Celery's text lines, which test_partitions reads (a host's default outside a terminal
    # is JSON: tasks.platform.logs).
    "KEEL_LOG_FORMAT": "text",
}


@pytest.fixture(scope="module")
def hosts() -> Iterator[KeelHosts]:
    """db, api, w1, w2, beat and client hosts running Keel; removed at the end, whatever happens."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    stack = KeelHosts(settings=SETTINGS, worker_args=("-c", "3", "-I", "tests.support.jobs"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
