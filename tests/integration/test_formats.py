"""Formats: a worker reads the message and record layouts of its release and the one before,
and leaves a newer one alone (``tasks.jobs.model.formats``).

The fast tier: records in the module's Postgres, messages in the session's
Redis, a Celery worker in this process (``inline_worker``).
"""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text

from tasks.jobs import add
from tasks.jobs.intake.messages import KEEL_HEADER
from tasks.jobs.model import formats
from tasks.jobs.store import runs
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.chaos import priority_lists
from tests.support.client import record, unique
from tests.support.inline import join
from tests.support.stack import wait_for

pytestmark = pytest.mark.usefixtures("inline_worker")


def set_format(job_id: str, value: int) -> None:
    with transaction() as session:
        session.execute(
            text("UPDATE jobs SET format = :f WHERE id = :id"), {"f": value, "id": job_id}
        )


def claim(job_id: str) -> runs.ClaimedJob | None:
    return runs.claim_alone(job_id, uuid.uuid4().hex, 30, "formats-test")


def headers_in(queue: str) -> list[dict]:
    client = redis_client()
    raw = [m for name in priority_lists(queue) for m in client.lrange(name, 0, -1)]
    return [json.loads(message)["headers"] for message in raw]


def test_a_job_is_recorded_and_published_in_this_releases_formats():
    # Given a job added on a queue no worker consumes
    queue = unique("quiet")
    job = add("test.echo", {}, queue=queue).job_id
    # Then its record says format 1 (the column's default: no insert names it) and its
    # message's keel header says message format 1, as the release before wrote it
    with transaction() as session:
        stored = session.execute(text("SELECT format FROM jobs WHERE id = :id"), {"id": job})
        assert stored.scalar_one() == formats.RECORD_FORMAT == 1
    [headers] = headers_in(queue)
    assert headers[KEEL_HEADER] == str(formats.MESSAGE_FORMAT) == "1"


def test_a_record_in_a_newer_format_is_not_claimed_until_it_is_one_this_release_reads():
    # Given a waiting job whose record says a format this release does not read
    job = add("test.echo", {}, queue=unique("quiet")).job_id
    set_format(job, max(formats.RECORD_FORMATS_READ) + 1)
    # Then a delivery's claim leaves it waiting, untouched
    assert claim(job) is None
    assert record(job)["state"] == "waiting" and record(job)["attemptsStarted"] == 0
    # and once it is in a format this release reads, the same claim takes it
    set_format(job, formats.RECORD_FORMAT)
    claimed = claim(job)
    assert claimed is not None and claimed.id == job


def test_a_message_in_a_newer_format_is_not_run_and_its_job_stays_waiting(monkeypatch):
    # Given a job published in a message format newer than the worker reads
    newer = max(formats.MESSAGE_FORMATS_READ) + 1
    monkeypatch.setattr(formats, "MESSAGE_FORMAT", newer)
    job = add("test.echo", {"n": 1}, queue="default").job_id
    monkeypatch.setattr(formats, "MESSAGE_FORMAT", 1)
    # and after it, on the same queue, a job in this release's format
    control = add("test.echo", {"n": 2}, queue="default").job_id
    # When the worker has taken both messages
    assert join([control])[control]["state"] == "completed"
    wait_for(lambda: not headers_in("default"), timeout=10)
    # Then the newer one did not run: its record is still waiting, never started
    found = record(job)
    assert found["state"] == "waiting" and found["attemptsStarted"] == 0, found


@pytest.mark.parametrize(
    ("header", "read"),
    [(None, True), ("", True), ("1", True), (1, True), ("2", False), ("v2", False)],
)
def test_which_keel_headers_this_release_reads(header, read):
    assert formats.reads_message(header) is read
