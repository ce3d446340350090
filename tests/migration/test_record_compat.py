"""What this release records, the previous release's workers read: every record's options.

During a rolling upgrade (docs/operations/upgrading.md) a worker of the previous release
claims jobs this release recorded, and parses their ``jobs.opts`` with its own
``JobOptions``, which refuses keys it does not know: a job whose options it refuses is
never run, and ends failed after stalling. So every way this release records a job, with
every option it takes, must write ``jobs.opts`` in the previous release's terms; options
added since go to ``jobs.extra_opts`` (``JobOptions.columns``), and this release still
shows and honours them. ``test_rolling_upgrade`` runs both releases; this test checks the
layout directly, without waiting for an old worker to meet the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from celery import chord
from sqlalchemy import text

from tasks.jobs import Backoff, BulkJob, Deduplication, JobOptions, KeepJobs, add, add_bulk
from tasks.jobs.observe.queries import describe_full, get
from tasks.jobs.schedule import schedulers
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope
from tasks.jobs.store.runs import claim
from tasks.platform.db import transaction
from tests.support import broker_lists
from tests.support.client import bearer, unique
from tests.support.jobs import celery_add, celery_collect, celery_part, celery_retry, echo
from tests.support.releases import previous_module

pytestmark = pytest.mark.usefixtures("stack")

EVERY_OPTION = JobOptions(
    attempts=3,
    backoff=Backoff(type="exponential", delay=100, jitter=0.5),
    delay=86_400_000,
    remove_on_complete=KeepJobs(count=5, age=60),
    remove_on_fail=7,
    deduplication=Deduplication(id="compat", ttl=60_000),
    max_retries=4,
    expires_at=datetime.now(UTC) + timedelta(days=2),
    timeout=2500,
    concurrency_key="compat-key",
)


@pytest.fixture(scope="module")
def previous_options() -> type:
    return previous_module("tasks/jobs/options.py").JobOptions


@pytest.fixture
def idle_queue() -> Iterator[str]:
    with broker_lists.idle_queue("compat") as queue:
        yield queue


def recorded(job_id: str) -> tuple[dict, dict | None]:
    with transaction() as session:
        row = session.execute(
            text("SELECT opts, extra_opts FROM jobs WHERE id = :id"), {"id": job_id}
        ).one()
    return row.opts, row.extra_opts


def test_every_option_this_release_takes_is_recorded_where_the_previous_release_reads_it(
    idle_queue, client, previous_options
):
    # When jobs are recorded every way this release records them, with every option
    dedup = EVERY_OPTION.model_copy(update={"deduplication": Deduplication(id=unique("d"))})
    single = add("test.echo", {}, queue=idle_queue, opts=dedup).job_id
    bulk = add_bulk(
        [
            BulkJob(
                "test.echo",
                {"n": 1},
                idle_queue,
                EVERY_OPTION.model_copy(update={"job_id": unique("b")}),
            )
        ]
    )[0].job_id
    celery = celery_retry.apply_async(
        (1,),
        queue=idle_queue,
        time_limit=9,
        expires=7200,
        job_options={"maxRetries": 0, "attempts": 2, "removeOnFail": True},
    ).id
    plain = celery_add.apply_async((1, 2), queue=idle_queue).id
    handler = echo.apply_async(kwargs={"n": 2}, queue=idle_queue).id
    parts = chord(
        [celery_part.s(i, "compat").set(queue=idle_queue) for i in range(2)],
        celery_collect.s().set(queue=idle_queue),
    ).apply_async()
    headers = bearer(tenant=unique("t"), user="alice")
    body = {
        "name": "test.echo",
        "data": {},
        "opts": {
            "timeout": 2000,
            "concurrencyKey": "repo-1",
            "attempts": 2,
            "delay": 86_400_000,
            "backoff": {"type": "fixed", "delay": 50},
        },
    }
    posted = client.post("/api/v1/jobs", json=body, headers=headers)
    assert posted.status_code == 202, posted.get_data(as_text=True)
    over_http = posted.get_json()["jobId"]
    recorded_ids = [
        single,
        bulk,
        celery,
        plain,
        over_http,
        parts.id,
        *(part.id for part in parts.parent.results),
    ]

    # Then the previous release parses every record's jobs.opts
    for job_id in recorded_ids:
        opts, _extra = recorded(job_id)
        previous_options.model_validate(opts)  # raises on a key it does not know
    # and the options it lacks are kept beside them, shown and read by this release
    newer = {"maxRetries": 4, "timeout": 2500, "concurrencyKey": "compat-key"}
    assert recorded(single)[1] == newer
    assert recorded(bulk)[1] == newer
    assert recorded(over_http)[1] == {"timeout": 2000, "concurrencyKey": "repo-1"}
    assert recorded(celery)[1] == {"maxRetries": 0}
    assert recorded(plain)[1] == {"maxRetries": 3}  # the task's own (Celery's default)
    assert recorded(handler)[1] is None  # a Keel handler has no Celery retries
    shown = client.get(f"/api/v1/jobs/{over_http}", headers=headers).get_json()
    assert (shown["opts"]["timeout"], shown["opts"]["attempts"]) == (2000, 2)
    assert describe_full(get(celery))["opts"]["maxRetries"] == 0
    with transaction() as session:
        claimed = claim(session, celery, "compat-token", 30, "compat@test")
    assert claimed is not None and claimed.opts.max_retries == 0
    assert claimed.opts.attempts == 2 and claimed.opts.remove_on_fail is True


def test_a_later_release_s_extra_option_is_left_out_not_refused():
    # When a record carries, beside the options, one this release does not know (a later
    # release recorded it, during an upgrade)
    stored, extra = EVERY_OPTION.columns()
    read = JobOptions.from_stored(stored, {**(extra or {}), "fromTheFuture": {"x": 1}})
    # Then this release reads the rest as written
    assert read == EVERY_OPTION
    # while jobs.opts stays strict: a key there is a layout this release does not read
    with pytest.raises(ValueError, match="fromTheFuture"):
        JobOptions.from_stored({**stored, "fromTheFuture": 1})


def test_a_scheduler_s_template_keeps_newer_options_where_the_previous_release_looks_not(
    previous_options,
):
    # When a scheduler is saved with a template setting an option the previous release
    # lacks (its processes parse the stored spec, the template's options strictly)
    scope = Scope(unique("tenant"), "op")
    spec = SchedulerSpec.model_validate(
        {
            "pattern": "0 3 * * *",
            "template": {"name": "test.echo", "data": {}, "opts": {"timeout": 2000, "attempts": 2}},
        }
    )
    schedulers.upsert(scope, "nightly", spec, queue="default")
    try:
        record = schedulers.get(scope, "nightly")
        # Then the stored template's options are the previous release's, the rest beside them
        previous_options.model_validate(record.spec["template"]["opts"])
        assert set(record.spec["template"]) <= {"name", "data", "opts"}
        assert record.extra_opts == {"timeout": 2000}
        # and this release reads and shows the template whole
        shown = schedulers.describe(record)["template"]["opts"]
        assert (shown["attempts"], shown["timeout"]) == (2, 2000)
        assert (
            SchedulerSpec.model_validate(schedulers.spec_of(record)).template.opts.timeout == 2000
        )
    finally:
        schedulers.remove(scope, "nightly")
