"""Searching jobs (``GET /api/v1/jobs`` with ``data``, ``data.<path>``, ``idPrefix``, times
and ``error``; ``store.listing``): what each finds, within the caller's scope only, paged as
any listing, and the data search served by its index (``ix_jobs_data``)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text

from keel.cli import main as keel
from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.model import search
from tasks.jobs.model.models import JobRecord
from tasks.jobs.store.listing import JobFilter, _filtered
from tasks.platform.db import transaction
from tests.support.client import bearer, unique, wait_state
from tests.support.explain import plan

pytestmark = pytest.mark.usefixtures("inline_worker")
URL = "/api/v1/jobs"
DAY_MS = 86_400_000


def later(tenant: str, data: dict, user: str = "alice", job_id: str | None = None) -> str:
    """A job of ``tenant``'s ``user`` holding ``data``, delayed for a day (it does not run)."""
    opts = JobOptions(delay=DAY_MS, jobId=job_id)
    return add("test.echo", data, queue="default", opts=opts, owner=Owner(tenant, user)).job_id


def found(client, headers: dict, **params) -> list[str]:
    """Every job id the search lists, across its pages, in the order listed."""
    ids, cursor = [], None
    while True:
        query = {"limit": 10, **params, **({"cursor": cursor} if cursor else {})}
        response = client.get(URL, query_string=query, headers=headers)
        assert response.status_code == 200, response.get_json()
        body = response.get_json()
        ids += [job["jobId"] for job in body["jobs"]]
        cursor = body["nextCursor"]
        if cursor is None:
            return ids


def test_a_data_field_finds_its_jobs_as_number_and_as_text_and_nothing_of_another_tenant(client):
    # Given jobs of two tenants, both with a customer 42
    acme, globex = unique("acme"), unique("globex")
    as_number = later(acme, {"customerId": 42, "customer": {"region": "eu-west-1"}})
    as_text = later(acme, {"customerId": "42", "customer": {"region": "us-east-1"}})
    other = later(acme, {"customerId": 43})
    bobs = later(acme, {"customerId": 42}, user="bob")
    theirs = later(globex, {"customerId": 42})
    alice, operator = bearer(tenant=acme), bearer(tenant=acme, user="olga", roles=("operator",))
    # Then data.customerId=42 finds both spellings, newest first, in the caller's scope
    assert found(client, alice, **{"data.customerId": "42"}) == [as_text, as_number]
    assert found(client, operator, **{"data.customerId": "42"}) == [bobs, as_text, as_number]
    assert found(client, bearer(tenant=globex), **{"data.customerId": "42"}) == [theirs]
    assert found(client, bearer(tenant=globex, user="bob"), data="customerId=42") == []
    # and a quoted value is that string only; a nested path and a JSON object work alike
    assert found(client, alice, **{"data.customerId": '"42"'}) == [as_text]
    assert found(client, alice, **{"data.customer.region": "eu-west-1"}) == [as_number]
    assert found(client, alice, data='{"customer": {"region": "us-east-1"}}') == [as_text]
    # and several terms all hold
    assert found(client, alice, data="customerId=43") == [other]
    both = {"data": "customerId=42", "data.customer.region": "us-east-1"}
    assert found(client, alice, **both) == [as_text]


def test_arrays_booleans_and_null_in_the_data():
    tenant = unique("t")
    vip = later(tenant, {"tags": ["vip", "eu"], "paid": True, "coupon": None})
    plain = later(tenant, {"tags": ["eu"], "paid": False, "coupon": "X"})

    def ids(data: str) -> set[str]:
        where = JobFilter(tenant_id=tenant, data=search.parse(data))
        with transaction() as session:
            return set(session.scalars(_filtered(select(JobRecord.id), where)))

    assert ids('{"tags": ["vip"]}') == {vip}
    assert ids('tags=["eu"]') == {vip, plain}
    assert ids("paid=true") == {vip}
    assert ids("paid=false coupon=X") == {plain}
    assert ids("coupon=null") == {vip}


def test_id_prefix_times_and_paging(client):
    tenant, prefix = unique("t"), unique("order")
    alice = bearer(tenant=tenant)
    first = [later(tenant, {"n": n}, job_id=f"{prefix}-{n:02d}") for n in range(12)]
    between = datetime.now(UTC)
    second = [later(tenant, {"n": n}, job_id=f"{prefix}-{n:02d}") for n in range(12, 25)]
    later(tenant, {"n": 99}, job_id=f"{unique('other')}-1")
    # The prefix finds its 25 over 3 pages of 10, newest first, each once
    listed = found(client, alice, idPrefix=prefix)
    assert listed == (first + second)[::-1]
    # and the added-time bounds split them where the clock was read
    iso = between.isoformat()
    assert found(client, alice, idPrefix=prefix, createdFrom=iso) == second[::-1]
    assert found(client, alice, idPrefix=prefix, createdTo=iso) == first[::-1]
    # a prefix is literal text: LIKE's wildcards match themselves only
    assert found(client, alice, idPrefix=prefix[:3] + "%") == []


def test_error_text_and_finished_times_find_failed_jobs(client):
    tenant = unique("t")
    owner = Owner(tenant, "alice")
    failing = add(
        "test.always_fails", {}, queue="default", opts=JobOptions(attempts=1), owner=owner
    ).job_id
    ok = add("test.echo", {"x": 1}, queue="default", owner=owner).job_id
    failed = wait_state(failing, "failed", timeout=30)
    wait_state(ok, "completed", timeout=30)
    alice = bearer(tenant=tenant)
    words = failed["failedReason"].split()
    assert found(client, alice, error=words[0].upper()) == [failing]
    assert found(client, alice, error="no such text in it") == []
    ended = datetime.fromisoformat(failed["finishedOn"].replace("Z", "+00:00"))
    window = {
        "finishedFrom": (ended - timedelta(seconds=1)).isoformat(),
        "finishedTo": (ended + timedelta(seconds=1)).isoformat(),
    }
    assert failing in found(client, alice, **window)
    assert found(client, alice, finishedTo=(ended - timedelta(days=1)).isoformat()) == []


@pytest.mark.parametrize(
    "params, field",
    [
        ({"data": "customerId"}, "data"),
        ({"data": "{not json"}, "data"),
        ({"data": "[1, 2]"}, "data"),
        ({"data": "{}"}, "data"),
        ({"data": '{"a": NaN}'}, "data"),
        ({"data": "a..b=1"}, "data"),
        ({"data": " ".join(f"k{n}=1" for n in range(9))}, "data"),
        ({"data.customerId": ""}, "data.customerId"),
        ({"data.": "1"}, "data."),
        ({"data.a b": "1"}, "data.a b"),
        ({"data.x": '"unclosed'}, "data.x"),
        ({"createdFrom": "yesterday"}, "createdFrom"),
        ({"createdFrom": "2026-01-01T00:00:00"}, "createdFrom"),  # no offset: which zone?
        ({"finishedTo": "2026-13-01T00:00:00Z"}, "finishedTo"),
        ({"finishedTo": "0.5"}, "finishedTo"),  # not seconds since 1970
        ({"data.customerId": "\x00"}, "data.customerId"),  # Postgres's jsonb takes no NUL
        ({"data": 'customerId="\\u0000"'}, "data"),
        ({"data": '{"a": "\\ud800"}'}, "data"),  # a lone surrogate
        ({"data": '{"n": 1e999}'}, "data"),  # past a float
        ({"data": '{"a": ' + "[" * 900 + "]" * 900 + "}"}, "data"),  # deeper than Python reads
        ({"createdTo": "2026-12-07"}, "createdTo"),
        ({"error": "a\x00b"}, "error"),
        ({"idPrefix": ""}, "idPrefix"),
    ],
)
def test_a_search_that_cannot_be_read_is_400_naming_the_parameter(client, params, field):
    response = client.get(URL, query_string=params, headers=bearer())
    assert response.status_code == 400, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error", "message", "details"}
    assert field in [d["field"] for d in body["details"]], body


def test_the_cli_searches_every_tenants_jobs_or_one_tenants():
    acme, globex = unique("acme"), unique("globex")
    mine = later(acme, {"customerId": 42})
    theirs = later(globex, {"customerId": "42"})
    later(acme, {"customerId": 43})

    def listed(*args: str) -> list[dict]:
        result = CliRunner().invoke(keel, ["jobs", "list", "--limit", "100", *args])
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]

    assert [j["jobId"] for j in listed("--tenant", acme, "--data", "customerId=42")] == [mine]
    everyone = {j["jobId"] for j in listed("--data", "customerId=42")}
    assert {mine, theirs} <= everyone
    from_now = (datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert listed("--tenant", acme, "--created-from", "2999-01-01") == []
    assert len(listed("--tenant", acme, "--created-to", from_now + "+00:00")) == 2
    refused = CliRunner().invoke(keel, ["jobs", "list", "--data", "customerId"])
    assert refused.exit_code == 2 and "path=value" in refused.output


def load(records: int, acme: str, globex: str, customers: int) -> None:
    """``records`` finished records, half each tenant's; customer c in records of both."""
    with transaction() as session:
        session.execute(
            text(
                """
                INSERT INTO jobs (id, queue, name, data, opts, tenant_id, user_id, state,
                                  created_at, finished_on)
                SELECT :prefix || g, 'default', 'test.echo',
                       jsonb_build_object('customerId', (g / 2) % :customers, 'format', 'csv'),
                       '{}', CASE WHEN g % 2 = 0 THEN :acme ELSE :globex END, 'alice',
                       'completed', now() - make_interval(secs => g), now()
                FROM generate_series(1, :records) AS g
                """
            ),
            {
                "prefix": unique("bulk") + "-",
                "acme": acme,
                "globex": globex,
                "records": records,
                "customers": customers,
            },
        )
    with transaction() as session:
        session.execute(text("ANALYZE jobs"))


def test_the_data_search_takes_the_gin_index_over_the_tenants_history():
    # Given 20,000 records of two tenants, each customer in 5 records of each tenant
    acme, globex = unique("acme"), unique("globex")
    load(20_000, acme, globex, customers=2000)
    where = JobFilter(tenant_id=acme, data=search.parse("customerId=1234"))
    query = (
        _filtered(select(JobRecord), where)
        .order_by(JobRecord.created_at.desc(), JobRecord.id.desc())
        .limit(21)
    )
    with transaction() as session:
        # At 20,000 rows reading the whole table is the cheapest plan of all; what this checks
        # is which index Postgres takes instead (the 1M-record test below lets it choose).
        session.execute(text("SET LOCAL enable_seqscan = off"))
        chosen = plan(session, query)
        rows = session.scalars(query).all()
    # Then the plan reads ix_jobs_data, not the tenant's history newest first, and finds the
    # tenant's 5 records of that customer
    assert "ix_jobs_data" in chosen, chosen
    assert len(rows) == 5 and {row.tenant_id for row in rows} == {acme}
    assert {row.data["customerId"] for row in rows} == {1234}


@pytest.mark.slow  # a million records loaded: a release check
def test_a_million_records_of_two_tenants_searched_by_a_data_field(client):
    # Given 1,000,000 records, half each tenant's, each customer in 5 records of each
    acme, globex = unique("acme"), unique("globex")
    load(1_000_000, acme, globex, customers=100_000)
    operator = bearer(tenant=acme, user="olga", roles=("operator",))
    # When Postgres plans a search by itself, it reads ix_jobs_data
    where = JobFilter(tenant_id=acme, data=search.parse("customerId=31337"))
    query = _filtered(select(JobRecord), where).order_by(JobRecord.created_at.desc()).limit(21)
    with transaction() as session:
        chosen = plan(session, query)
    assert "ix_jobs_data" in chosen, chosen
    # and 200 searches through the API each answer the tenant's 5 records of that customer
    for customer in random.Random(7).sample(range(100_000), 200):
        response = client.get(URL, query_string={"data.customerId": customer}, headers=operator)
        numbers = [int(job["jobId"].rsplit("-", 1)[1]) for job in response.get_json()["jobs"]]
        assert len(numbers) == 5, (customer, response.get_json())
        # record g holds customer g / 2 % 100,000 and is acme's when g is even
        assert all(g // 2 % 100_000 == customer and g % 2 == 0 for g in numbers), numbers
