"""What a job's messages say of its keys (read from the broker, no worker): its tenant, whose
keys its key limits are, and the concurrency key its call gave (``concurrencyKey``), on the
first message and on one published again from the record (a delayed job promoted). How a
worker admits by them: ``test_key_lines.py``, ``test_key_limits.py``."""

from __future__ import annotations

import pytest

from tasks.jobs import JobOptions, Owner, acting_as, add
from tasks.jobs.intake.celery_options import with_options
from tasks.jobs.intake.messages import KEY_HEADER, TENANT_HEADER
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.observe.queries import describe_full, get
from tasks.jobs.store import upkeep
from tasks.platform.db import transaction
from tests.support.broker_lists import headers_in
from tests.support.client import unique
from tests.support.jobs import echo

pytestmark = pytest.mark.usefixtures("stack")


def test_a_tenant_s_job_carries_its_tenant_and_its_call_s_key(idle_queue):
    tenant = unique("acme")
    # When a tenant's job is added with a concurrency key, and another without
    owner = Owner(tenant, "alice")
    opts = JobOptions(concurrencyKey="repo-7")
    keyed = add("test.echo", {}, queue=idle_queue, opts=opts, owner=owner)
    with acting_as(owner):
        plain = echo.apply_async(kwargs={"n": 1}, queue=idle_queue)
    system = add("test.echo", {}, queue=idle_queue)
    headers = headers_in(idle_queue)
    # Then its message names the tenant and the key; a system job's names neither
    assert (headers[keyed.job_id][TENANT_HEADER], headers[keyed.job_id][KEY_HEADER]) == (
        tenant,
        "repo-7",
    )
    assert headers[plain.id][TENANT_HEADER] == tenant and KEY_HEADER not in headers[plain.id]
    assert TENANT_HEADER not in headers[system.job_id] and KEY_HEADER not in headers[system.job_id]
    # and the key is one of the job's options, as shown
    assert describe_full(get(keyed.job_id))["opts"]["concurrencyKey"] == "repo-7"


def test_a_delayed_job_s_message_carries_them_when_due(idle_queue):
    tenant = unique("acme")
    with acting_as(Owner(tenant, "alice")):
        delayed = echo.apply_async(
            kwargs={"n": 1},
            queue=idle_queue,
            countdown=60,
            job_options={"concurrencyKey": "customer-9"},
        )
    assert headers_in(idle_queue) == {}
    with transaction() as session:
        publish_ready(session, upkeep.promote_now(session, [delayed.id]))
    headers = headers_in(idle_queue)[delayed.id]
    assert (headers[TENANT_HEADER], headers[KEY_HEADER]) == (tenant, "customer-9")


def test_a_call_cannot_name_its_tenant_or_key_in_its_headers(idle_queue):
    for header in (TENANT_HEADER, KEY_HEADER):
        with pytest.raises(ValueError, match="Celery's own"):
            echo.apply_async(kwargs={"n": 1}, queue=idle_queue, headers={header: "globex"})
    assert headers_in(idle_queue) == {}


def test_a_long_key_travels_as_its_digest_and_an_empty_one_is_refused():
    long_key = "x" * 150
    assert len(long_key) > 100
    ctx = with_options(None, JobOptions(concurrencyKey=long_key))
    assert ctx is not None and ctx["concurrency_key"].startswith("sha256:")
    with pytest.raises(ValueError):
        JobOptions(concurrencyKey="")
