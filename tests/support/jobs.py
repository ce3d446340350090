"""Handlers that exist only in the test worker (loaded with ``celery worker -I``)."""

from __future__ import annotations

from tasks.jobs import JobContext, UnrecoverableError, handler


class PlainFailure(Exception):
    """An ordinary, retryable error."""


@handler("test.always_fails", queue="default")
def always_fails(job: JobContext) -> None:
    raise PlainFailure(f"plain failure on run {job.attempts_started}")


@handler("test.unrecoverable", queue="default")
def unrecoverable(job: JobContext) -> None:
    raise UnrecoverableError("this input can never succeed")


@handler("test.echo", queue="default")
def echo(job: JobContext) -> dict:
    return {"echo": job.data}
