"""The queues page's charts: completed, failed, wait and run time per queue over the last
hour, day or week, from the queue history (the tenant's own ends only)."""

from __future__ import annotations

import re

import pytest

from tasks.jobs.store import counts
from tests.support.client import ended_jobs, unique
from tests.support.ui import PAGE, signed_in

pytestmark = pytest.mark.usefixtures("inline_worker")
OPERATOR = ("operator",)


def chart(page: str, queue: str, kind: str) -> str:
    card = page[page.index(f'data-queue="{queue}"') :]
    found = re.search(rf'<figure class="chart-box" data-chart="{kind}"(.*?)</figure>', card, re.S)
    assert found, f"no {kind} chart for {queue}"
    return found.group(1)


@pytest.mark.parametrize("span", ["hour", "day", "week"])
def test_the_charts_show_the_tenants_ends_over_each_range(app, span):
    # Given a tenant's 3 completed and 2 failed jobs on "default", and another tenant's 4
    tenant, other = unique("charts"), unique("charts-other")
    ended_jobs(tenant, "test.echo", 3, "completed")
    ended_jobs(tenant, "test.unrecoverable", 2, "failed")
    ended_jobs(other, "test.echo", 4, "completed")
    counts.compact()
    # When its operator opens the queues page at that range
    page = signed_in(app, tenant, "olga", OPERATOR).get(f"/ui/queues?range={span}", headers=PAGE)
    text = page.get_data(as_text=True)
    assert page.status_code == 200
    # Then the range is the current one, and each chart says its numbers
    assert re.search(rf'data-range="{span}" aria-current="page"', text)
    completed, failed = chart(text, "default", "completed"), chart(text, "default", "failed")
    assert 'data-total="3"' in completed and f"3 completed in the last {span}" in completed
    assert 'data-total="2"' in failed and f"2 failed in the last {span}" in failed
    for kind in ("wait", "run"):
        assert re.search(
            rf"{kind} time: average [\d.]+ m?s, max [\d.]+ m?s over 5 runs",
            chart(text, "default", kind),
        )
    assert text.count("<rect") >= 4 * {"hour": 12, "day": 48, "week": 28}[span]
    # And each bar's title says its bucket and count
    bars = re.findall(
        r"<title>\d{4}-\d\d-\d\d \d\d:\d\d to \d\d:\d\d UTC: (\d+) completed</title>", completed
    )
    assert len(bars) == {"hour": 12, "day": 48, "week": 28}[span] and sum(map(int, bars)) == 3


def test_an_unknown_range_reads_as_the_hour_and_members_do_not_see_the_page(app):
    tenant = unique("charts-range")
    page = signed_in(app, tenant, "olga", OPERATOR).get("/ui/queues?range=year", headers=PAGE)
    assert page.status_code == 200
    assert 'data-range="hour" aria-current="page"' in page.get_data(as_text=True)
    member = signed_in(app, tenant, "alice").get("/ui/queues?range=day", headers=PAGE)
    assert member.status_code in (403, 404)
