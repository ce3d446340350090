"""Fixtures of the chaos tests: workers that are always stopped, whatever the test did."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.client import unique
from tests.support.stack import WorkerProcess


@pytest.fixture
def spawn(stack) -> Iterator[Callable[..., WorkerProcess]]:
    """Start a ``celery worker`` named after ``prefix``; every one is stopped at teardown."""
    started: list[WorkerProcess] = []

    def start(prefix: str, **options) -> WorkerProcess:
        process = WorkerProcess(stack.home, unique(prefix), **options)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop(timeout=20)
