"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import broker_lists


@pytest.fixture
def idle_queue(request: pytest.FixtureRequest) -> Iterator[str]:
    """A queue of its own that no worker consumes, named after the test's module; its
    lists and records go afterwards (``tests.support.broker_lists.idle_queue``)."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    with broker_lists.idle_queue(module[:24]) as queue:
        yield queue
