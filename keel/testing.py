"""Fixtures for your project's tests: real Keel jobs on a throwaway stack.

Enable them in your ``conftest.py``::

    pytest_plugins = ["keel.testing"]

and use them::

    def test_the_confirmation_is_sent(keel_worker):
        result = confirm.delay("order-1")
        assert result.get(timeout=10) == "sent"  # waits for the job's end: no sleep

- ``keel_stack`` (session): an embedded Postgres and Redis in a temporary folder,
  migrated, gone when the session ends (the ``[embedded]`` extra:
  ``pip install 'keel-jobs[embedded]'``). Before your modules are collected, the plugin
  points ``KEEL_DATABASE_URL`` and ``KEEL_REDIS_URL`` at them (the servers start when a
  test first asks for the fixture), so that Keel's app, imported by your job modules, is
  configured for them and never for a server of yours.
- ``keel_worker`` (session): a Celery worker of Keel's app in threads of the test
  process, consuming every job queue, with Keel's maintenance (delays, retries,
  promotions) running as in a real worker.

For tests that need no servers at all, use Celery's eager mode
(``task_always_eager``; docs/celery.md#eager).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HOME: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Point Keel at the session's throwaway servers before anything imports it."""
    global _HOME
    from keel.embedded import free_port

    _HOME = Path(tempfile.mkdtemp(prefix="keel-tests-"))
    os.environ.pop("KEEL_BROKER_URL", None)
    os.environ.update(
        KEEL_HOME=str(_HOME),
        KEEL_DATABASE_URL=f"postgresql://postgres:@/postgres?host={_HOME / 'pg'}",
        KEEL_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        KEEL_SECRET_KEY=os.environ.get("KEEL_SECRET_KEY") or os.urandom(32).hex(),
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    if _HOME is not None:
        shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def keel_stack() -> Iterator[dict[str, str]]:
    """The session's embedded Postgres and Redis, migrated; their URLs."""
    from urllib.parse import urlparse

    from keel import extras
    from keel.embedded import EmbeddedPostgres, EmbeddedRedis
    from tasks.platform import db
    from tasks.platform.config import reload_settings
    from tasks.platform.migrate import migrate

    assert _HOME is not None, "keel.testing was not configured (pytest_plugins)"
    absent = extras.missing(extras.EMBEDDED)
    if absent:  # one line, not an ImportError from deep inside a server's start
        needed = f"`{extras.install('embedded')}` ({', '.join(absent)} not installed)"
        pytest.fail(f"keel_stack's embedded servers need {needed}", pytrace=False)
    postgres = EmbeddedPostgres(_HOME)
    postgres.start()
    port = urlparse(os.environ["KEEL_REDIS_URL"]).port
    redis_server = EmbeddedRedis(_HOME, port, persist=False)
    redis_server.start()
    try:
        reload_settings()
        db.dispose()
        migrate()
        yield {"database": os.environ["KEEL_DATABASE_URL"], "redis": os.environ["KEEL_REDIS_URL"]}
    finally:
        db.dispose()
        redis_server.stop()
        postgres.stop()


@pytest.fixture(scope="session")
def keel_worker(keel_stack: dict[str, str]) -> Iterator[Any]:
    """A worker of Keel's app in threads of this process, consuming every job queue."""
    from celery.contrib.testing.worker import start_worker

    from tasks.celery import app
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.model import registry
    from tasks.platform.catalog import celery_queues

    load_job_modules()
    queues = sorted({*celery_queues(), *registry.queues()})
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        loglevel="WARNING",
        queues=queues,
    ) as worker:
        yield worker
