"""The dashboard's job search (``/ui/jobs`` with the API's search parameters): the form's
fields, the caller's scope, links that keep the search, and no bulk action on a search."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tasks.jobs import JobOptions, Owner, add
from tests.support.client import unique
from tests.support.ui import PAGE, signed_in

pytestmark = pytest.mark.usefixtures("stack")
DAY_MS = 86_400_000


def later(tenant: str, data: dict, user: str = "alice") -> str:
    opts = JobOptions(delay=DAY_MS)
    return add("test.echo", data, queue="default", opts=opts, owner=Owner(tenant, user)).job_id


def test_the_search_box_finds_the_tenants_jobs_by_a_data_field_and_keeps_it_on_every_link(app):
    acme, globex = unique("acme"), unique("globex")
    wanted = [later(acme, {"customerId": 42}) for _ in range(3)]
    other = later(acme, {"customerId": 7})
    theirs = later(globex, {"customerId": 42})
    operator = signed_in(app, acme, "olga", ("operator",))
    # The form's Data field sends data=customerId=42
    page = operator.get(f"/ui/jobs?data={quote('customerId=42')}&limit=2", headers=PAGE).get_data(
        as_text=True
    )
    assert wanted[2] in page and wanted[1] in page
    assert other not in page and theirs not in page
    assert 'value="customerId=42"' in page  # the box shows what was searched
    # the next page's link keeps the search, and holds the third
    older = page.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
    assert "data=customerId" in older.replace("%3D", "=")
    third = operator.get(older.replace("&amp;", "&"), headers=PAGE).get_data(as_text=True)
    assert wanted[0] in third and other not in third and theirs not in third
    # and a data.<path> parameter works as in the API, the auto-refreshed table alike
    table = operator.get("/ui/jobs/table?data.customerId=7").get_data(as_text=True)
    assert other in table and not any(job in table for job in (*wanted, theirs))
    # while a search is on, the bulk form (queue, state and name only) is not offered
    assert 'id="bulk-form"' not in page and 'id="bulk-search-note"' in page
    assert 'id="bulk-form"' in operator.get("/ui/jobs", headers=PAGE).get_data(as_text=True)


def test_the_forms_time_fields_are_read_as_utc_and_a_bad_search_is_a_400_page(app):
    tenant = unique("t")
    job = later(tenant, {"n": 1})
    alice = signed_in(app, tenant, "alice")
    # datetime-local sends no offset: the page reads it as UTC
    found = alice.get("/ui/jobs?createdFrom=2000-01-01T00:00", headers=PAGE)
    assert found.status_code == 200 and job in found.get_data(as_text=True)
    assert 'value="2000-01-01T00:00"' in found.get_data(as_text=True)
    none = alice.get("/ui/jobs?createdFrom=2999-01-01T00:00", headers=PAGE)
    assert job not in none.get_data(as_text=True)
    bad = alice.get(f"/ui/jobs?data={quote('customerId')}", headers=PAGE)
    assert bad.status_code == 400 and "path=value" in bad.get_data(as_text=True)
