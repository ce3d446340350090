"""The dashboard's per-state counts of a listing: a tenant's jobs (or one queue's of them)
come from the counters, a narrower listing (a user's jobs, a job name) from the records;
both agree with the records."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.end.cancel import cancel
from tasks.jobs.observe.queries import JobFilter, count_states
from tasks.jobs.store import listing
from tasks.platform.db import transaction
from tests.support import broker_lists
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def on_records(where: JobFilter) -> dict[str, int]:
    with transaction() as session:
        return listing.state_counts(session, where)


def test_a_tenant_s_counts_come_from_the_counters_and_match_the_records():
    tenant = unique("acme")
    alice, bob = Owner(tenant, "alice"), Owner(tenant, "bob")
    with broker_lists.idle_queue("counts") as first, broker_lists.idle_queue("counts") as second:
        later = JobOptions(delay=600_000)
        for owner, queue, delayed in ((alice, first, 3), (bob, second, 2)):
            for _ in range(delayed):
                add("test.echo", {}, queue=queue, owner=owner, opts=later)
            add("test.echo", {}, queue=queue, owner=owner)  # waiting: no worker on the queue
        cancel(add("test.echo", {}, queue=first, owner=alice, opts=later).job_id, None)
        everything = JobFilter(tenant_id=tenant)
        counted = count_states(everything)
        assert counted == on_records(everything)
        assert (counted["delayed"], counted["waiting"], counted["cancelled"]) == (5, 2, 1)
        one_queue = JobFilter(tenant_id=tenant, queue=first)
        assert count_states(one_queue) == on_records(one_queue)
        assert count_states(one_queue)["delayed"] == 3
        # a listing filtered by state counts the other states all the same
        assert count_states(JobFilter(tenant_id=tenant, state="waiting")) == counted
        # a user's own jobs are counted on the records
        bobs = JobFilter(tenant_id=tenant, user_id="bob")
        assert count_states(bobs)["delayed"] == 2 and count_states(bobs)["cancelled"] == 0


def test_the_tenant_wide_counts_do_not_read_the_records():
    # Given a record written behind the counters' back (their trigger off)
    tenant = unique("acme")
    with transaction() as session:
        session.execute(text("SET LOCAL session_replication_role = replica"))
        session.execute(
            text(
                "INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state)"
                " VALUES (:id, 'default', 'test.echo', '{}', '{}', :t, 'alice', 'completed')"
            ),
            {"id": unique("unseen"), "t": tenant},
        )
    try:
        # Then the tenant's counts do not see it, and a user's (read on the records) do
        assert count_states(JobFilter(tenant_id=tenant))["completed"] == 0
        assert count_states(JobFilter(tenant_id=tenant, user_id="alice"))["completed"] == 1
    finally:
        with transaction() as session:
            session.execute(text("SET LOCAL session_replication_role = replica"))
            session.execute(text("DELETE FROM jobs WHERE tenant_id = :t"), {"t": tenant})
