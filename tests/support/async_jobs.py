"""``async def`` tasks that exist only in the test worker (loaded with ``celery worker -I``)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from celery import shared_task

from tasks.jobs import JobContext, KeelTask, handler


async def http_status(url: str) -> int:
    """The status of ``GET url`` (HTTP/1.0, awaited on the loop: no client library)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(f"GET {parts.path or '/'} HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode())
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return int(status_line.split()[1])


@shared_task(
    bind=True,
    base=KeelTask,
    name="test.async_fetch",
    autoretry_for=(ConnectionError,),
    retry_backoff=1,
    retry_jitter=False,
    max_retries=3,
)
async def async_fetch(self, url: str, fails: int) -> dict:
    """Fails ``fails`` times (autoretry with backoff), then awaits an HTTP call."""
    await asyncio.sleep(0.05)
    if self.request.retries < fails:
        raise ConnectionError(f"attempt {self.request.retries + 1} could not connect")
    return {"status": await http_status(url), "retries": self.request.retries}


@shared_task(base=KeelTask, name="test.async_sleep")
async def async_sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@shared_task(bind=True, base=KeelTask, name="test.async_soft_limited", soft_time_limit=1)
async def async_soft_limited(self, seconds: float) -> dict:
    """Awaits ``seconds``; Celery's soft time limit (1 s) cancels it at its await first."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        self.log("cancelled at its await")
        raise
    return {"slept": seconds}


@handler("test.async_handler", queue="default")
async def async_handler(job: JobContext) -> dict:
    """A ``handler(job)`` that is a coroutine: progress and its log, awaited between."""
    job.update_progress(50)
    await asyncio.sleep(0.05)
    job.log("halfway")
    return {"n": job.data.get("n")}
