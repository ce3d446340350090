"""When a generation may be sent (the count equation), as pure logic."""

from __future__ import annotations

import pytest

from tasks.notifications.generations import Readiness


@pytest.mark.parametrize(
    ("closed", "assigned", "loaded", "group_id", "complete"),
    [
        (True, 2, 2, "g-1", True),
        (True, 2, 1, "g-1", False),  # a straggler is still loading
        (False, 2, 2, "g-1", False),  # more chunks may join
        (True, 2, 2, None, False),  # no group to send
        (True, 0, 0, "g-1", False),  # prepared ahead, no chunk joined: nothing to send
    ],
)
def test_a_generation_is_complete_only_when_closed_grouped_and_every_chunk_loaded(
    closed, assigned, loaded, group_id, complete
):
    ready = Readiness(closed, assigned, loaded, group_id, sent=False)
    assert ready.complete is complete
