"""``GET /api/v1/queues/history`` (``web.queues``): the tenant's ends per queue over the
last hour, day or week, as the dashboard's charts read them (operators)."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise

import pytest

from tasks.jobs.store import counts
from tests.support.client import bearer, ended_jobs, unique

pytestmark = pytest.mark.usefixtures("inline_worker")
URL = "/api/v1/queues/history"
BUCKETS = {"hour": (12, 300), "day": (48, 1_800), "week": (28, 21_600)}


@pytest.mark.parametrize("span", ["hour", "day", "week"])
def test_an_operator_reads_its_tenants_ends_per_bucket(client, span):
    # Given a tenant's 3 completed and 2 failed jobs on "default", and another tenant's 4
    tenant, other = unique("hist"), unique("hist-other")
    ended_jobs(tenant, "test.echo", 3, "completed")
    ended_jobs(tenant, "test.unrecoverable", 2, "failed")
    ended_jobs(other, "test.echo", 4, "completed")
    counts.compact()
    # When its operator reads the span
    answer = client.get(f"{URL}?span={span}", headers=bearer(tenant=tenant, roles=("operator",)))
    assert answer.status_code == 200, answer.get_json()
    found = answer.get_json()
    # Then every bucket of the span is there, oldest first, a step apart
    count, step = BUCKETS[span]
    assert found["span"] == span and found["stepSeconds"] == step
    assert list(found["queues"]) == ["default"]
    buckets = found["queues"]["default"]
    starts = [datetime.fromisoformat(b["start"].replace("Z", "+00:00")) for b in buckets]
    assert (
        len(buckets) == count
        and starts[0].isoformat()
        == datetime.fromisoformat(found["since"].replace("Z", "+00:00")).isoformat()
    )
    assert all((b - a).total_seconds() == step for a, b in pairwise(starts))
    # and its own ends only, with their wait and run times
    assert sum(b["completed"] for b in buckets) == 3
    assert sum(b["failed"] for b in buckets) == 2
    timed = [b for b in buckets if b["runAvgS"] is not None]
    assert timed and all(0 <= b["waitAvgS"] <= b["waitMaxS"] for b in timed)
    assert all(0 <= b["runAvgS"] <= b["runMaxS"] for b in timed)


def test_a_tenant_with_no_ends_has_no_queues_and_bad_input_is_400(client):
    operator = bearer(tenant=unique("quiet"), roles=("operator",))
    answer = client.get(URL, headers=operator)
    assert answer.status_code == 200 and answer.get_json()["span"] == "hour"
    assert answer.get_json()["queues"] == {}
    refused = client.get(f"{URL}?span=year", headers=operator)
    assert refused.status_code == 400 and refused.get_json()["details"][0]["field"] == "span"
    assert client.get(f"{URL}?range=day", headers=operator).status_code == 400
    assert client.get(URL, headers=bearer(tenant=unique("t"))).status_code == 403
